// llamapy's shim over llama.cpp's chat layer (common/chat.h): see llamapy_shim.h.
//
// Every entry point takes and returns JSON text, runs inside a try/catch and reports a failure
// as a status with the exception's message, as the libllama wrappers in llamapy_shim.cpp do.
// The streaming parser is llama-server's task_result_state::update_chat_msg: the whole output
// so far is parsed again at each piece (partial while generating, final at the end) and the
// difference to the previous parse is what streams.

#include "llamapy_shim.h"
#include "llamapy_guard.hpp"

#include "chat.h"
#include "json.h"
#include "reasoning-budget.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

struct llamapy_chat_templates {
    common_chat_templates_ptr ptr;
};

struct llamapy_chat_stream {
    common_chat_parser_params params;
    std::string               text;
    common_chat_msg           msg;
};

namespace {

using json = common_json;

// A malloc'd copy of ``text`` for the caller (freed with llamapy_chat_free_string).
char * give(const std::string & text) {
    char * out = static_cast<char *>(std::malloc(text.size() + 1));
    if (out == nullptr) {
        throw std::bad_alloc();
    }
    std::memcpy(out, text.data(), text.size());
    out[text.size()] = '\0';
    return out;
}

common_chat_templates_inputs read_inputs(const json & in) {
    common_chat_templates_inputs inputs;
    inputs.messages              = common_chat_msgs_parse_oaicompat(in.at("messages"));
    inputs.tools                 = common_chat_tools_parse_oaicompat(in.value("tools", json::array()));
    inputs.tool_choice           = common_chat_tool_choice_parse_oaicompat(in.value("tool_choice", std::string("auto")));
    inputs.json_schema           = in.value("json_schema", std::string());
    inputs.grammar               = in.value("grammar", std::string());
    inputs.add_generation_prompt = in.value("add_generation_prompt", true);
    if (in.contains("continue_final_message")) {
        inputs.continue_final_message = common_chat_continuation_parse(in.at("continue_final_message"));
    }
    inputs.use_jinja           = in.value("use_jinja", true);
    inputs.parallel_tool_calls = in.value("parallel_tool_calls", false);
    inputs.reasoning_format    = common_reasoning_format_from_name(in.value("reasoning_format", std::string("none")));
    inputs.enable_thinking     = in.value("enable_thinking", true);
    inputs.add_bos             = in.value("add_bos", false);
    inputs.add_eos             = in.value("add_eos", false);
    inputs.force_pure_content  = in.value("force_pure_content", false);
    if (in.contains("chat_template_kwargs")) {
        for (const auto & item : in.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    return inputs;
}

json params_json(const common_chat_params & params) {
    json triggers = json::array();
    for (const auto & trigger : params.grammar_triggers) {
        json one = json::object();
        one["type"]  = static_cast<int>(trigger.type);
        one["value"] = trigger.value;
        one["token"] = static_cast<int>(trigger.token);
        triggers.push_back(one);
    }
    json out = json::object();
    out["format"]             = static_cast<int>(params.format);
    out["format_name"]        = std::string(common_chat_format_name(params.format));
    out["prompt"]             = params.prompt;
    out["grammar"]            = params.grammar;
    out["grammar_lazy"]       = params.grammar_lazy;
    out["generation_prompt"]  = params.generation_prompt;
    out["supports_thinking"]  = params.supports_thinking;
    out["thinking_start_tag"] = params.thinking_start_tag;
    out["thinking_end_tags"]  = params.thinking_end_tags;
    out["grammar_triggers"]   = triggers;
    out["preserved_tokens"]   = params.preserved_tokens;
    out["additional_stops"]   = params.additional_stops;
    out["parser"]             = params.parser;
    return out;
}

json diff_json(const common_chat_msg_diff & diff) {
    json out = json::object();
    out["reasoning_content"] = diff.reasoning_content_delta;
    out["content"]           = diff.content_delta;
    out["index"]             = diff.tool_call_index == std::string::npos ? -1 : static_cast<int>(diff.tool_call_index);
    out["id"]                = diff.tool_call_delta.id;
    out["name"]              = diff.tool_call_delta.name;
    out["arguments"]         = diff.tool_call_delta.arguments;
    return out;
}

json msg_json(const common_chat_msg & msg) {
    json calls = json::array();
    for (const auto & call : msg.tool_calls) {
        json one = json::object();
        one["id"]        = call.id;
        one["name"]      = call.name;
        one["arguments"] = call.arguments;
        calls.push_back(one);
    }
    json out = json::object();
    out["content"]           = msg.content;
    out["reasoning_content"] = msg.reasoning_content;
    out["tool_calls"]        = calls;
    return out;
}

common_chat_parser_params read_parser_params(const json & in) {
    common_chat_parser_params params;
    params.format               = static_cast<common_chat_format>(in.value("format", 0));
    if (params.format < 0 || params.format >= COMMON_CHAT_FORMAT_COUNT) {
        throw std::invalid_argument("unknown chat format");
    }
    params.reasoning_format     = common_reasoning_format_from_name(in.value("reasoning_format", std::string("none")));
    params.reasoning_in_content = in.value("reasoning_in_content", false);
    params.generation_prompt    = in.value("generation_prompt", std::string());
    params.parse_tool_calls     = in.value("parse_tool_calls", true);
    params.is_continuation      = in.value("is_continuation", false);
    params.echo                 = in.value("echo", false);
    const std::string parser    = in.value("parser", std::string());
    if (!parser.empty()) {
        params.parser.load(parser);
    }
    return params;
}

}  // namespace

extern "C" {

void llamapy_chat_free_string(char * text) {
    std::free(text);
}

int llamapy_chat_templates_init(const struct llama_model * model, const char * override_src,
                                const char * bos, const char * eos,
                                struct llamapy_chat_templates ** out, char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        std::string src = override_src ? override_src : "";
        if (src.empty() && model == nullptr) {
            throw std::invalid_argument("a template source or a model is needed");
        }
        auto holder = std::make_unique<llamapy_chat_templates>();
        holder->ptr = common_chat_templates_init(model, src, bos ? bos : "", eos ? eos : "");
        *out = holder.release();
        return LLAMAPY_OK;
    });
}

void llamapy_chat_templates_free(struct llamapy_chat_templates * tmpls) {
    delete tmpls;
}

int llamapy_chat_templates_info(const struct llamapy_chat_templates * tmpls, char ** out,
                                char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        json info = json::object();
        json caps = json::object();
        for (const auto & [name, value] : common_chat_templates_get_caps(tmpls->ptr.get())) {
            caps[name] = value;
        }
        info["caps"]                    = caps;
        info["explicit"]                = common_chat_templates_was_explicit(tmpls->ptr.get());
        info["source"]                  = common_chat_templates_source(tmpls->ptr.get());
        info["tool_use_source"]         = common_chat_templates_source(tmpls->ptr.get(), "tool_use");
        info["supports_enable_thinking"] = common_chat_templates_support_enable_thinking(tmpls->ptr.get());
        *out = give(info.dump());
        return LLAMAPY_OK;
    });
}

int llamapy_chat_apply(const struct llamapy_chat_templates * tmpls, const char * inputs_json,
                       char ** out, char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        const auto inputs = read_inputs(json::parse(inputs_json));
        const auto params = common_chat_templates_apply(tmpls->ptr.get(), inputs);
        *out = give(params_json(params).dump());
        return LLAMAPY_OK;
    });
}

int llamapy_chat_stream_new(const char * params_json_text, struct llamapy_chat_stream ** out,
                            char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        auto stream    = std::make_unique<llamapy_chat_stream>();
        stream->params = read_parser_params(json::parse(params_json_text));
        if (stream->params.is_continuation && !stream->params.echo) {
            // the prefilled assistant text is not a delta
            stream->msg = common_chat_parse("", true, stream->params);
        }
        *out = stream.release();
        return LLAMAPY_OK;
    });
}

void llamapy_chat_stream_free(struct llamapy_chat_stream * stream) {
    delete stream;
}

int llamapy_chat_stream_feed(struct llamapy_chat_stream * stream, const char * text, size_t len,
                             bool is_partial, char ** out, char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        stream->text.append(text, len);
        json diffs = json::array();
        auto parsed = common_chat_parse(stream->text, is_partial, stream->params);
        if (!parsed.empty()) {
            // a call keeps the id it had when first seen (llama-server's id cache): an id
            // the model writes after the name does not restart the call
            for (size_t i = 0; i < parsed.tool_calls.size() && i < stream->msg.tool_calls.size(); ++i) {
                parsed.tool_calls[i].id = stream->msg.tool_calls[i].id;
            }
            for (const auto & diff : common_chat_msg_diff::compute_diffs(stream->msg, parsed)) {
                diffs.push_back(diff_json(diff));
            }
            stream->msg = parsed;
        }
        json result = json::object();
        result["diffs"] = diffs;
        result["msg"]   = msg_json(stream->msg);
        *out = give(result.dump());
        return LLAMAPY_OK;
    });
}

int llamapy_sampler_init_reasoning_budget(
        const struct llama_vocab * vocab, const llama_token * start, size_t n_start,
        const llama_token * ends, const size_t * end_lens, size_t n_ends,
        const llama_token * forced, size_t n_forced, int32_t budget,
        struct llama_sampler ** out, char * what, size_t what_size) {
    *out = nullptr;
    return llamapy::guard(what, what_size, [&]() {
        std::vector<llama_tokens> starts;
        if (n_start > 0) {
            starts.emplace_back(start, start + n_start);
        }
        std::vector<llama_tokens> end_seqs;
        size_t at = 0;
        for (size_t i = 0; i < n_ends; ++i) {
            end_seqs.emplace_back(ends + at, ends + at + end_lens[i]);
            at += end_lens[i];
        }
        const llama_tokens forced_tokens(forced, forced + n_forced);
        *out = common_reasoning_budget_init(
            vocab, starts, end_seqs, forced_tokens, budget,
            n_start > 0 ? REASONING_BUDGET_IDLE : REASONING_BUDGET_COUNTING);
        return LLAMAPY_OK;
    });
}

}  // extern "C"
