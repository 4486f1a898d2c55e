"""Chat templates in the bounded sandbox: each limit at work, and real templates unharmed."""
import asyncio
import threading

import pytest

from stackd.chat import templates
from stackd.chat.limits import InferenceLimits
from stackd.chat.sandbox import ChatTemplate, TemplateFailure

LIMITS = InferenceLimits()
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def render(source: str, limits: InferenceLimits = LIMITS, messages=MESSAGES) -> str:
    return ChatTemplate(source, "<s>", "</s>").render(messages, limits)


def fails(source: str, needle: str, limits: InferenceLimits = LIMITS) -> None:
    with pytest.raises(TemplateFailure) as failure:
        render(source, limits)
    assert any(n in str(failure.value) for n in needle.split("|")), failure.value


def test_chatml_renders_as_before():
    assert render(templates.CHATML) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("source, needle", [
    # on a busy machine the deadline may come before the operation budget: either stops it
    ("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
     "template_max_ops|template_timeout"),
    ("{% set s = 'ab' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
     "template_max_ops|template_timeout"),
    ("{{ 'x' * 300000000 }}", "template_max_bytes"),
    ("{{ ([1] * 100000000) | length }}", "template_max_items"),
    ("{{ range(200000) | list | length }}", "template_max_items"),
    ("{{ 'x' | center(1000000000) }}", "template_max_bytes"),
    ("{{ 'x'.ljust(1000000000) }}", "template_max_bytes"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", "template_max_bytes"),
    ("{{ '%999999999d' % 1 }}", "template_max_bytes"),
    ("{{ '{:999999999}'.format(1) }}", "template_max_bytes"),
    ("{% set l = ['y' * 100000] * 100 %}{{ l | join }}", "template_max_bytes"),
    ("{{ ('x' * 1000000).replace('', 'yyyyy') }}", "template_max_bytes"),
    ("{{ 10 ** 100000000 }}", "power"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed"),
    ("{{ raise_exception('no system role allowed') }}", "no system role allowed"),
    ("{{ foo.bar.baz }}", "undefined"),
    ("{% for %}", "does not compile"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
])
def test_each_limit_stops_a_hostile_template(source, needle):
    fails(source, needle)


def test_the_time_limit_holds_when_operations_are_plenty():
    many_ops = InferenceLimits(template_max_ops=10 ** 12, template_timeout=0.2)
    fails("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
          "template_timeout", many_ops)


def test_the_output_is_capped():
    small = InferenceLimits(template_max_bytes=1000)
    fails("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}", "template_max_bytes", small)
    assert len(render("{% for i in range(10) %}{{ 'x' * 50 }}{% endfor %}", small)) == 500


def test_a_template_that_fails_to_compile_fails_every_render_the_same_way():
    template = ChatTemplate("{% if %}", "<s>", "</s>")
    for _ in range(2):
        with pytest.raises(TemplateFailure):
            template.render(MESSAGES, LIMITS)


def test_loops_over_messages_and_loop_variables_work():
    source = ("{% for m in messages %}{{ loop.index }}:{{ m['role'] }}={{ m.content | trim }};"
              "{% endfor %}{{ messages | tojson }}")
    assert render(source).startswith("1:system=Be brief.;2:user=hi;[{")


def test_prompts_are_rendered_off_the_loop_thread_and_tokenized_by_the_runner():
    seen = {}

    class Template(ChatTemplate):
        def render(self, messages, limits, extra=None):
            seen["thread"] = threading.current_thread().name
            return super().render(messages, limits, extra)

    class Runner:
        def check_open(self):
            pass

        async def tokenize(self, texts, add_special, parse_special):
            seen["texts"], seen["flags"] = texts, (add_special, parse_special)
            return [[1, 2, 3]]

    class Model:
        runner = Runner()
        template = Template(templates.CHATML, "<s>", "</s>")

    tokens = asyncio.run(templates.prompt_tokens(Model(), MESSAGES))
    assert tokens == [1, 2, 3]
    assert seen["thread"].startswith("stackd-render") and seen["thread"] != threading.main_thread().name
    # the rendered text, whole, as special tokens (the template wrote them), without a BOS added
    assert seen["texts"] == [Model.template.render(MESSAGES, templates.limits.current)]
    assert seen["flags"] == (False, True)


def test_a_template_writes_the_models_bos_and_eos_text_and_chatml_stands_in_for_none():
    facts = {"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
             "bos_text": "<|begin_of_text|>", "eos_text": "<|eot_id|>"}
    rendered = templates.template_for(facts).render(MESSAGES, templates.limits.current)
    assert rendered.startswith("<|begin_of_text|>") and rendered.endswith("<|eot_id|>")
    none = templates.template_for({"chat_template": "", "bos_text": "", "eos_text": ""})
    assert none.render(MESSAGES, templates.limits.current) == ChatTemplate(templates.CHATML, "", "").render(
        MESSAGES, templates.limits.current)
