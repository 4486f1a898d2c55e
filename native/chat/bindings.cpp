// stackd._chat: llama.cpp's chat formats (common/chat.h), for the tool-call and reasoning syntax
// of each model family.
//
// `analyze` runs llama.cpp's C++ jinja runtime on a model's template, which has no bound on
// time, operations or memory: the daemon calls it only in a child process it can kill
// (server/chat/formats.py), never in its own. `parse` only reads generated text with the PEG
// parser `analyze` serialized; it runs in the daemon.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "log.h"

namespace py = pybind11;

namespace {

// The patterns llama.cpp's own sampler builds from a trigger (common/sampling.cpp); a token
// trigger is matched by its text, as the engine's lazy grammar sees text.
std::string trigger_pattern(const common_grammar_trigger & t) {
    switch (t.type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
            return t.value;
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
            if (t.value.empty()) {
                return "^$";
            }
            return (t.value.front() != '^' ? "^" : "") + t.value + (t.value.back() != '$' ? "$" : "");
        }
        default:
            return regex_escape(t.value);
    }
}

common_chat_tool_choice choice_of(const std::string & s) {
    if (s == "required") {
        return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    }
    if (s == "none") {
        return COMMON_CHAT_TOOL_CHOICE_NONE;
    }
    return COMMON_CHAT_TOOL_CHOICE_AUTO;
}

py::dict caps_of(const common_chat_templates * t) {
    py::dict out;
    for (const auto & [name, value] : common_chat_templates_get_caps(t)) {
        out[py::str(name)] = value;
    }
    return out;
}

// One analysis: the template's capabilities, the prompt it renders for `messages_json`, and
// what the answer's format needs (grammar, lazy triggers, stops, the serialized parser).
py::dict analyze(const std::string & source, const std::string & bos, const std::string & eos,
                 const std::string & messages_json, const std::string & tools_json,
                 const std::string & tool_choice, bool parallel, bool enable_thinking,
                 bool extract_reasoning) {
    auto templates = common_chat_templates_init(nullptr, source, bos, eos);
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
    if (!tools_json.empty()) {
        inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
    }
    inputs.tool_choice = choice_of(tool_choice);
    inputs.parallel_tool_calls = parallel;
    inputs.enable_thinking = enable_thinking;
    inputs.reasoning_format = extract_reasoning ? COMMON_REASONING_FORMAT_DEEPSEEK : COMMON_REASONING_FORMAT_NONE;
    inputs.use_jinja = true;
    const common_chat_params params = common_chat_templates_apply(templates.get(), inputs);

    py::list patterns;
    for (const auto & t : params.grammar_triggers) {
        patterns.append(trigger_pattern(t));
    }
    py::dict out;
    out["caps"] = caps_of(templates.get());
    out["supports_enable_thinking"] = common_chat_templates_support_enable_thinking(templates.get());
    out["format"] = (int) params.format;
    out["format_name"] = common_chat_format_name(params.format);
    out["prompt"] = py::bytes(params.prompt);
    out["grammar"] = params.grammar;
    out["grammar_lazy"] = params.grammar_lazy;
    out["trigger_patterns"] = patterns;
    out["preserved_tokens"] = params.preserved_tokens;
    out["additional_stops"] = params.additional_stops;
    out["parser"] = py::bytes(params.parser);
    out["generation_prompt"] = py::bytes(params.generation_prompt);
    out["supports_thinking"] = params.supports_thinking;
    out["thinking_start_tag"] = params.thinking_start_tag;
    out["thinking_end_tags"] = params.thinking_end_tags;
    return out;
}

// A PEG parser loaded once (from analyze's "parser"), read many times while a stream grows.
class parser {
public:
    parser(int format, const std::string & serialized, const std::string & generation_prompt,
           bool extract_reasoning, bool parse_tool_calls) {
        params_.format = (common_chat_format) format;
        params_.generation_prompt = generation_prompt;
        params_.reasoning_format = extract_reasoning ? COMMON_REASONING_FORMAT_DEEPSEEK : COMMON_REASONING_FORMAT_NONE;
        params_.parse_tool_calls = parse_tool_calls;
        if (!serialized.empty()) {
            params_.parser.load(serialized);
        }
    }

    // (content, reasoning, [(name, arguments, id)]); raises ValueError when a whole text does
    // not parse (a partial one never does).
    py::tuple parse(const std::string & text, bool partial) const {
        common_chat_msg msg;
        try {
            msg = common_chat_parse(text, partial, params_);
        } catch (const std::exception & e) {
            throw py::value_error(e.what());
        }
        py::list calls;
        for (const auto & c : msg.tool_calls) {
            calls.append(py::make_tuple(c.name, c.arguments, c.id));
        }
        return py::make_tuple(msg.content, msg.reasoning_content, calls);
    }

private:
    common_chat_parser_params params_;
};

// llama.cpp's JSON-schema-to-GBNF converter (the one llama-server uses for response_format and
// tool schemas). No template runs here, so the daemon may call it; the schema's budget is
// checked before (server/chat/grammar.py). A schema it cannot convert is a ValueError.
std::string schema_grammar(const std::string & schema_json) {
    try {
        return json_schema_to_grammar(common_json::parse(schema_json), /*force_gbnf=*/true);
    } catch (const std::exception & e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

PYBIND11_MODULE(_chat, m) {
    m.doc() = "llama.cpp's chat formats: template analysis (in a killable child only) and parsing";
    common_log_set_verbosity_thold(-1);
    m.def("analyze", &analyze, py::arg("source"), py::arg("bos"), py::arg("eos"),
          py::arg("messages_json"), py::arg("tools_json"), py::arg("tool_choice"),
          py::arg("parallel"), py::arg("enable_thinking"), py::arg("extract_reasoning"));
    m.def("json_schema_to_grammar", &schema_grammar, py::arg("schema_json"),
          py::call_guard<py::gil_scoped_release>());
    py::class_<parser>(m, "Parser")
        .def(py::init<int, const std::string &, const std::string &, bool, bool>(),
             py::arg("format"), py::arg("serialized"), py::arg("generation_prompt"),
             py::arg("extract_reasoning"), py::arg("parse_tool_calls"))
        .def("parse", &parser::parse, py::arg("text"), py::arg("partial"));
}
