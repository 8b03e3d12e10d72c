/* llamapy's shim over libllama: the libllama calls that can throw a C++ exception, each run
 * inside try/catch, so that no exception crosses into Python (through cffi an exception that
 * leaves a C function ends the process).
 *
 * Every wrapper returns a status (enum llamapy_status), writes its result through an out
 * pointer and, on failure, copies the exception's what() into ``what`` (``what_size`` bytes,
 * always NUL-terminated). build_lib.py compiles this shim against the built libllama and
 * generates the cffi declarations from this header (after llama.h, which it includes).
 *
 * Change LLAMAPY_SHIM_ABI whenever a declaration here changes; the loader refuses a shim
 * whose ABI is not the one llamapy expects.
 */
#ifndef LLAMAPY_SHIM_H
#define LLAMAPY_SHIM_H

#include "llama.h"

#if defined(_WIN32)
#    define LLAMAPY_SHIM_API __declspec(dllexport)
#else
#    define LLAMAPY_SHIM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { LLAMAPY_SHIM_ABI = 3 };

enum llamapy_status {
    LLAMAPY_OK               = 0,
    LLAMAPY_ERR_EXCEPTION    = 1, /* a std::exception other than std::bad_alloc */
    LLAMAPY_ERR_NO_MEMORY    = 2, /* std::bad_alloc */
    LLAMAPY_ERR_UNKNOWN      = 3, /* an exception that is no std::exception */
    LLAMAPY_ERR_NO_CANDIDATE = 4, /* sampling: every candidate token was excluded */
    LLAMAPY_ERR_NO_LOGITS    = 5  /* sampling: the batch row has no logits */
};

/* The LLAMAPY_SHIM_ABI this library was compiled with. */
LLAMAPY_SHIM_API int llamapy_shim_abi(void);

/* A ggml_abort_callback for llama_set_abort_callback that is also a heartbeat: ``data`` points
 * to two int64_t; the first is incremented at every call (ggml calls it between the nodes of a
 * graph, so it advances while a decode computes), the second is the abort flag (nonzero: the
 * decode aborts). Both are read and written atomically. */
LLAMAPY_SHIM_API bool llamapy_heartbeat(void * data);

/* llama_sampler_sample, checked: the chain's pick must be a candidate that no sampler excluded
 * (a finite or +inf logit) before it is accepted; otherwise LLAMAPY_ERR_NO_CANDIDATE and
 * nothing is accepted (llama.cpp would accept it: a grammar then aborts the process). */
LLAMAPY_SHIM_API int llamapy_sampler_sample(
        struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx, llama_token * out,
        char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_accept(
        struct llama_sampler * smpl, llama_token token, char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_apply(
        struct llama_sampler * smpl, llama_token_data_array * cur_p, char * what,
        size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_chain_add(
        struct llama_sampler * chain, struct llama_sampler * smpl, char * what,
        size_t what_size);

/* Sampler constructors whose work or memory grows with a request's input. ``*out`` is NULL
 * when libllama returned NULL without throwing (a grammar that does not parse). */
LLAMAPY_SHIM_API int llamapy_sampler_init_grammar(
        const struct llama_vocab * vocab, const char * grammar_str, const char * grammar_root,
        struct llama_sampler ** out, char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_init_penalties(
        int32_t n_vocab, int32_t penalty_last_n, float penalty_repeat, float penalty_freq,
        float penalty_present, struct llama_sampler ** out, char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_init_dry(
        const struct llama_vocab * vocab, float dry_multiplier, float dry_base,
        int32_t dry_allowed_length, int32_t dry_penalty_last_n, const char ** seq_breakers,
        size_t num_breakers, struct llama_sampler ** out, char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_sampler_init_logit_bias(
        int32_t n_vocab, int32_t n_logit_bias, const llama_logit_bias * logit_bias,
        struct llama_sampler ** out, char * what, size_t what_size);

/* llama_decode (its return code in ``*out``) and llama_tokenize (its result in ``*out``). */
LLAMAPY_SHIM_API int llamapy_decode(
        struct llama_context * ctx, const struct llama_batch * batch, int32_t * out,
        char * what, size_t what_size);
LLAMAPY_SHIM_API int llamapy_tokenize(
        const struct llama_vocab * vocab, const char * text, int32_t text_len,
        llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special,
        int32_t * out, char * what, size_t what_size);

/* llama.cpp's chat layer (common/chat.h), JSON in and out (llamapy_chat.cpp). Every text
 * returned through ``out`` is malloc'd: free it with llamapy_chat_free_string. */
struct llamapy_chat_templates;
struct llamapy_chat_stream;

LLAMAPY_SHIM_API void llamapy_chat_free_string(char * text);

/* The chat templates of ``model`` (its own, and its tool-use variant), or of ``override_src``
 * when that is not empty (then ``model`` may be NULL, and ``bos``/``eos`` name its tokens). */
LLAMAPY_SHIM_API int llamapy_chat_templates_init(
        const struct llama_model * model, const char * override_src, const char * bos,
        const char * eos, struct llamapy_chat_templates ** out, char * what, size_t what_size);
LLAMAPY_SHIM_API void llamapy_chat_templates_free(struct llamapy_chat_templates * tmpls);
/* {"caps", "explicit", "source", "tool_use_source", "supports_enable_thinking"} */
LLAMAPY_SHIM_API int llamapy_chat_templates_info(
        const struct llamapy_chat_templates * tmpls, char ** out, char * what, size_t what_size);
/* common_chat_templates_apply: ``inputs_json`` holds the conversation in OpenAI's shape and
 * the controls; ``out`` gets the prompt, grammar, triggers, stops and the output parser. */
LLAMAPY_SHIM_API int llamapy_chat_apply(
        const struct llamapy_chat_templates * tmpls, const char * inputs_json, char ** out,
        char * what, size_t what_size);

/* A streaming parser of one generation (``params_json``: the format and parser that
 * llamapy_chat_apply gave, and the reasoning controls). Each feed appends ``text`` and
 * parses the whole output again; ``out`` gets {"diffs", "msg"}. */
LLAMAPY_SHIM_API int llamapy_chat_stream_new(
        const char * params_json, struct llamapy_chat_stream ** out, char * what,
        size_t what_size);
LLAMAPY_SHIM_API void llamapy_chat_stream_free(struct llamapy_chat_stream * stream);
LLAMAPY_SHIM_API int llamapy_chat_stream_feed(
        struct llamapy_chat_stream * stream, const char * text, size_t len, bool is_partial,
        char ** out, char * what, size_t what_size);

/* common_reasoning_budget_init (libllama-common): a sampler that counts the tokens of a
 * reasoning block (opened by the ``n_start`` tokens of ``start``, or already open when
 * ``n_start`` is 0) and, past ``budget``, forces ``forced`` (the budget message and an end
 * tag). ``ends`` holds ``n_ends`` end sequences back to back, ``end_lens`` their lengths. */
LLAMAPY_SHIM_API int llamapy_sampler_init_reasoning_budget(
        const struct llama_vocab * vocab, const llama_token * start, size_t n_start,
        const llama_token * ends, const size_t * end_lens, size_t n_ends,
        const llama_token * forced, size_t n_forced, int32_t budget,
        struct llama_sampler ** out, char * what, size_t what_size);

/* Throws inside the guard the exception ``kind`` names (1 std::runtime_error, 2 std::bad_alloc,
 * 3 a non-std exception; anything else throws nothing), so tests can check every status. */
LLAMAPY_SHIM_API int llamapy_shim_selftest(int kind, char * what, size_t what_size);

#ifdef __cplusplus
}
#endif

#endif /* LLAMAPY_SHIM_H */
