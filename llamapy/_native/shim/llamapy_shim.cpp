// llamapy's shim over libllama: see llamapy_shim.h for the contract.
//
// Each wrapper runs its libllama call through guard(), which turns a C++ exception into a
// status and copies what() for the caller. llamapy_sampler_sample also checks the chain's pick
// before accepting it: a pick that every sampler excluded (a grammar that allows no token the
// biases leave) would otherwise reach the grammar's accept, which throws or, for an
// end-of-generation token, calls GGML_ABORT, which no try/catch can stop.

#include "llamapy_shim.h"
#include "llamapy_guard.hpp"

#include <cmath>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <vector>

namespace {

using llamapy::copy_what;
using llamapy::guard;

// The candidate array of the last sample on this thread (reused: n_vocab entries).
thread_local std::vector<llama_token_data> candidates;

// llama_sampler_sample's CPU path, with the pick checked before it is accepted.
int sample_checked(llama_sampler * smpl, llama_context * ctx, int32_t idx, llama_token * out,
                   char * what, size_t what_size) {
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (logits == nullptr) {
        copy_what(what, what_size, "the batch row has no logits");
        return LLAMAPY_ERR_NO_LOGITS;
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    candidates.resize(n_vocab);
    for (llama_token id = 0; id < n_vocab; ++id) {
        candidates[id] = llama_token_data{id, logits[id], 0.0f};
    }
    llama_token_data_array cur_p = {candidates.data(), candidates.size(), -1, false};
    llama_sampler_apply(smpl, &cur_p);
    const bool picked = cur_p.selected >= 0 && (size_t) cur_p.selected < cur_p.size;
    if (!picked || !(cur_p.data[cur_p.selected].logit > -INFINITY)) {
        copy_what(what, what_size,
                  "no token is left to sample: the samplers (grammar, logit bias, ...) "
                  "exclude every candidate");
        return LLAMAPY_ERR_NO_CANDIDATE;
    }
    const llama_token token = cur_p.data[cur_p.selected].id;
    llama_sampler_accept(smpl, token);
    *out = token;
    return LLAMAPY_OK;
}

// A sampler made by a constructor: OK with *out set (NULL when libllama returned NULL).
template <typename F>
int construct(llama_sampler ** out, char * what, size_t what_size, F && make) noexcept {
    *out = nullptr;
    return guard(what, what_size, [&] {
        *out = make();
        return LLAMAPY_OK;
    });
}

}  // namespace

extern "C" {

int llamapy_shim_abi(void) {
    return LLAMAPY_SHIM_ABI;
}

bool llamapy_heartbeat(void * data) {
    auto * beat = static_cast<int64_t *>(data);
    __atomic_add_fetch(&beat[0], 1, __ATOMIC_RELAXED);
    return __atomic_load_n(&beat[1], __ATOMIC_RELAXED) != 0;
}

int llamapy_sampler_sample(llama_sampler * smpl, llama_context * ctx, int32_t idx,
                           llama_token * out, char * what, size_t what_size) {
    return guard(what, what_size, [&] {
        // A backend sampler (llama_set_sampler) picked already: libllama's own path.
        if (llama_get_sampled_token_ith(ctx, idx) != LLAMA_TOKEN_NULL ||
            llama_get_sampled_probs_ith(ctx, idx) != nullptr ||
            llama_get_sampled_logits_ith(ctx, idx) != nullptr) {
            *out = llama_sampler_sample(smpl, ctx, idx);
            return (int) LLAMAPY_OK;
        }
        return sample_checked(smpl, ctx, idx, out, what, what_size);
    });
}

int llamapy_sampler_accept(llama_sampler * smpl, llama_token token, char * what,
                           size_t what_size) {
    return guard(what, what_size, [&] {
        llama_sampler_accept(smpl, token);
        return LLAMAPY_OK;
    });
}

int llamapy_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p, char * what,
                          size_t what_size) {
    return guard(what, what_size, [&] {
        llama_sampler_apply(smpl, cur_p);
        return LLAMAPY_OK;
    });
}

int llamapy_sampler_chain_add(llama_sampler * chain, llama_sampler * smpl, char * what,
                              size_t what_size) {
    return guard(what, what_size, [&] {
        llama_sampler_chain_add(chain, smpl);
        return LLAMAPY_OK;
    });
}

int llamapy_sampler_init_grammar(const llama_vocab * vocab, const char * grammar_str,
                                 const char * grammar_root, llama_sampler ** out, char * what,
                                 size_t what_size) {
    return construct(out, what, what_size, [&] {
        return llama_sampler_init_grammar(vocab, grammar_str, grammar_root);
    });
}

int llamapy_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n, float penalty_repeat,
                                   float penalty_freq, float penalty_present,
                                   llama_sampler ** out, char * what, size_t what_size) {
    return construct(out, what, what_size, [&] {
        return llama_sampler_init_penalties(n_vocab, penalty_last_n, penalty_repeat,
                                            penalty_freq, penalty_present);
    });
}

int llamapy_sampler_init_dry(const llama_vocab * vocab, float dry_multiplier, float dry_base,
                             int32_t dry_allowed_length, int32_t dry_penalty_last_n,
                             const char ** seq_breakers, size_t num_breakers,
                             llama_sampler ** out, char * what, size_t what_size) {
    return construct(out, what, what_size, [&] {
        return llama_sampler_init_dry(vocab, dry_multiplier, dry_base, dry_allowed_length,
                                      dry_penalty_last_n, seq_breakers, num_breakers);
    });
}

int llamapy_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias,
                                    const llama_logit_bias * logit_bias, llama_sampler ** out,
                                    char * what, size_t what_size) {
    return construct(out, what, what_size, [&] {
        return llama_sampler_init_logit_bias(n_vocab, n_logit_bias, logit_bias);
    });
}

int llamapy_decode(llama_context * ctx, const llama_batch * batch, int32_t * out, char * what,
                   size_t what_size) {
    return guard(what, what_size, [&] {
        *out = llama_decode(ctx, *batch);
        return LLAMAPY_OK;
    });
}

int llamapy_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                     llama_token * tokens, int32_t n_tokens_max, bool add_special,
                     bool parse_special, int32_t * out, char * what, size_t what_size) {
    return guard(what, what_size, [&] {
        *out = llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special,
                              parse_special);
        return LLAMAPY_OK;
    });
}

int llamapy_shim_selftest(int kind, char * what, size_t what_size) {
    return guard(what, what_size, [&] {
        if (kind == 1) {
            throw std::runtime_error("selftest: a std::runtime_error");
        }
        if (kind == 2) {
            throw std::bad_alloc();
        }
        if (kind == 3) {
            throw kind;
        }
        return LLAMAPY_OK;
    });
}

}  // extern "C"
