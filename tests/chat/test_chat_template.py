"""ChatTemplate: HF-compatible rendering of real templates, normalisation and errors."""

from __future__ import annotations

import copy
import json
from datetime import datetime

import pytest

from llamapy.chat import CHATML_TEMPLATE, ChatTemplate, ToolArguments, normalize_messages
from llamapy.errors import TemplateError, UnsupportedFeatureError

# SmolLM2-135M-Instruct's tokenizer.chat_template, verbatim from its GGUF metadata.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] +"
    " '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A template in the style of Qwen2.5's: tools listed as JSON in the system turn, assistant
# tool calls as <tool_call> JSON with `arguments | tojson`, tool results as <tool_response>.
QWEN_STYLE_TEMPLATE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def smollm() -> ChatTemplate:
    return ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")


def test_smollm_injects_default_system_prompt(smollm: ChatTemplate) -> None:
    out = smollm.render([{"role": "user", "content": "Hi"}])
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm_keeps_given_system_prompt_and_no_generation_prompt(smollm: ChatTemplate) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    out = smollm.render(messages, add_generation_prompt=False)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )


def test_content_parts_are_joined(smollm: ChatTemplate) -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    out = smollm.render([{"role": "system", "content": parts}], add_generation_prompt=False)
    assert out == "<|im_start|>system\none\ntwo<|im_end|>\n"


def test_image_parts_are_unsupported(smollm: ChatTemplate) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(UnsupportedFeatureError) as info:
        smollm.render([{"role": "user", "content": parts}])
    assert info.value.feature == "image_url"


def test_qwen_style_tools_and_tool_calls() -> None:
    template = ChatTemplate(QWEN_STYLE_TEMPLATE, eos_token="<|im_end|>")
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    ]
    out = template.render(messages, tools=[WEATHER_TOOL])
    assert out == (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>\n"
        + json.dumps(WEATHER_TOOL)
        + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tool_arguments_work_as_dict_and_as_text() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls %}{% set a = c.function.arguments %}"
        "{{ a | tojson }}|{{ a }}|{{ 'x=' + a }}|{{ a.city }}|{{ a is mapping }}"
        "{% endfor %}{% endfor %}"
    )
    call = {"function": {"name": "f", "arguments": '{"city":"Zürich"}'}}
    out = template.render([{"role": "assistant", "tool_calls": [call]}])
    assert out == '{"city": "Zürich"}|{"city":"Zürich"}|x={"city":"Zürich"}|Zürich|True'


def test_non_object_arguments_stay_strings() -> None:
    messages = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "oops"}}]}
    ]
    normalized = normalize_messages(messages)
    assert normalized[0]["tool_calls"][0]["function"]["arguments"] == "oops"
    dict_args = [{"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": 1}}}]}]
    value = normalize_messages(dict_args)[0]["tool_calls"][0]["function"]["arguments"]
    assert isinstance(value, ToolArguments) and str(value) == '{"a": 1}'


def test_inputs_are_not_mutated() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
    ]
    before = copy.deepcopy(messages)
    ChatTemplate(CHATML_TEMPLATE).render(messages[:1])
    normalize_messages(messages)
    assert messages == before


def test_raise_exception_becomes_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="first must be user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_syntax_error_fails_at_compile_time() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0]['content'] + 1 }}",  # TypeError in the template
        "{{ messages[5]['content'] | upper }}",  # undefined used as a value
        "{{ messages.append(1) }}",  # the sandbox refuses mutation
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # and unsafe attributes
    ],
)
def test_render_failures_become_template_errors(source: str) -> None:
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_malformed_messages() -> None:
    template = ChatTemplate(CHATML_TEMPLATE)
    with pytest.raises(TemplateError, match="no role"):
        template.render([{"content": "x"}])
    with pytest.raises(TemplateError, match="list"):
        template.render("hello")  # type: ignore[arg-type]


def test_helpers_and_variables() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{{ messages[0].content | tojson }}{{ {'a': [1]} | tojson(indent=2) }}"
        "{{ strftime_now('%Y') }}{{ enable_thinking }}{{ undefined_is_empty }}{{ eos_token }}"
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        "{% generation %}G{% endgeneration %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    out = template.render([{"role": "user", "content": "é"}], enable_thinking=False)
    year = str(datetime.now().year)
    assert out == '<s>"é"{\n  "a": [\n    1\n  ]\n}' + year + "False</s>01G"


def test_trim_and_lstrip_blocks() -> None:
    template = ChatTemplate("  {% if true %}\nA\n  {% endif %}\nB")
    assert template.render([]) == "A\nB"


def test_chatml_fallback() -> None:
    template = ChatTemplate.from_metadata(None)
    assert template.source == CHATML_TEMPLATE
    assert template.eos_token == "<|im_end|>"
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own = ChatTemplate.from_metadata(SMOLLM2_TEMPLATE, eos_token="<|im_end|>")
    assert own.source == SMOLLM2_TEMPLATE


def test_digest_identifies_the_source() -> None:
    assert ChatTemplate(SMOLLM2_TEMPLATE).digest == ChatTemplate(SMOLLM2_TEMPLATE).digest
    assert ChatTemplate(SMOLLM2_TEMPLATE).digest != ChatTemplate(CHATML_TEMPLATE).digest
    assert len(ChatTemplate(CHATML_TEMPLATE).digest) == 64


def test_template_error_carries_http_status() -> None:
    assert TemplateError.http_status == 400


def test_llama_cpp_leniencies() -> None:
    """What llama.cpp's Jinja runtime allows, so its repository templates render alike."""
    t = ChatTemplate('{{ missing + "a" }}|{{ "b" + missing }}|{{ "c" + none }}|{{ 1 + 2 }}')
    assert t.render([]) == "a|b|c|3"
    with pytest.raises(TemplateError):
        ChatTemplate("{{ missing + 1 }}").render([])
    think = ChatTemplate("{% if not enable_thinking %}closed{% else %}open{% endif %}")
    assert think.render([]) == "open"
    assert think.render([], enable_thinking=False) == "closed"
    dated = ChatTemplate("{{ date_string }}/{{ datetime }}").render([])
    today = datetime.now()
    assert dated == f"{today.strftime('%d %b %Y')}/{today.strftime('%b %d %Y')}"
