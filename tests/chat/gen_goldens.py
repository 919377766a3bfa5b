#!/usr/bin/env python3
"""Generate tests/chat/data/goldens.json: Hugging Face renders of chat templates.

Every expected string comes from transformers' own renderer (render_jinja_template: jinja2 with
HF's environment), for
  * the public model templates in data/templates/*.jinja (as they appear in the models'
    tokenizer_config.json files) over a set of conversations, and
  * small feature templates that exercise one Jinja construct each.
test_chat_template.cpp renders the same inputs with our interpreter and compares byte for byte.

It also writes data/tokenizer_configs/<model>.json: copies of the test models' (template-less)
tokenizer_config.json with a public chat_template added, so that tests (C++ and the server's
pytest) can run chat on models/test/* without modifying models/.

Run from anywhere:  python3 tests/chat/gen_goldens.py   (needs transformers and jinja2)
"""
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
REPO = os.path.dirname(os.path.dirname(HERE))

# Test model -> the public template its fixture tokenizer_config.json carries.
FIXTURE_TEMPLATES = {"llama3-tiny": "llama3-instruct", "llama2-tiny": "llama2-chat",
                     "mistral-tiny": "mistral-v0.3", "qwen2-tiny": "qwen2.5-instruct"}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a pirate."},
                    {"role": "user", "content": "Hi there"}],
    "multi": [{"role": "user", "content": "What is 2+2?"},
              {"role": "assistant", "content": "4."},
              {"role": "user", "content": "And 3+3?"}],
    "system_multi": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Name a color."},
                     {"role": "assistant", "content": "Blue."},
                     {"role": "user", "content": "Another?"}],
    "whitespace": [{"role": "user", "content": "  padded \n text \t "},
                   {"role": "assistant", "content": "\n reply  "},
                   {"role": "user", "content": "x"}],
    "unicode": [{"role": "user",
                 "content": "naïve café 日本語 🙂 \"double\" 'single' {{ not a tag }} {% nope %} \\n"}],
    "assistant_last": [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello, how can I help?"}],
    "empty_content": [{"role": "user", "content": ""}],
    "bad_order": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "tool_use": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call12345", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21}"},
    ],
}

# (template, conversations it is meant for, extra variables)
MODEL_CASES = [
    ("llama2-chat", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                     "assistant_last", "empty_content", "bad_order"], {}),
    ("llama3-instruct", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                         "assistant_last", "empty_content", "bad_order"], {}),
    ("mistral-v0.1", ["user", "multi", "whitespace", "unicode", "assistant_last", "empty_content",
                      "bad_order", "system_user"], {}),
    ("qwen2-instruct", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                        "assistant_last", "empty_content"], {}),
    ("chatml", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                "assistant_last", "empty_content"], {}),
    ("llama3.2-instruct", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                           "assistant_last", "empty_content"], {"date_string": "26 Jul 2024"}),
    ("llama3.2-instruct", ["user", "system_user", "tool_use"],
     {"date_string": "26 Jul 2024", "tools": TOOLS}),
    ("qwen2.5-instruct", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                          "assistant_last", "empty_content"], {}),
    ("qwen2.5-instruct", ["user", "system_user", "tool_use"], {"tools": TOOLS}),
    ("mistral-v0.3", ["user", "system_user", "multi", "system_multi", "whitespace", "unicode",
                      "assistant_last", "empty_content", "bad_order"], {}),
    ("mistral-v0.3", ["user", "tool_use"], {"tools": TOOLS}),
]

SPECIAL_TOKENS = {
    "llama2-chat": ("<s>", "</s>"), "mistral-v0.1": ("<s>", "</s>"), "mistral-v0.3": ("<s>", "</s>"),
    "llama3-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2-instruct": ("", "<|im_end|>"), "qwen2.5-instruct": ("", "<|im_end|>"),
    "chatml": ("", "<|im_end|>"),
}

# Feature templates: one construct each; rendered with messages = CONVERSATIONS["multi"] and
# the extra variables below.
FEATURE_EXTRA = {"n": 7, "f": 2.5, "s": "Hello World", "items": [3, 1, 2, 3],
                 "d": {"b": 2, "a": 1, "c": [1, {"x": None}]},
                 "people": [{"name": "Ann", "age": 31}, {"name": "Bob", "age": 25},
                            {"name": "Cy", "age": 40, "admin": True}],
                 "u": "héllo wörld", "empty": "", "nothing": None}

FEATURES = {
    # whitespace control, trim_blocks, lstrip_blocks
    "ws_trim_lstrip": "a\n  {% if true %}\n    x\n  {% endif %}\nb\n",
    "ws_dash": "[ {%- if true -%}  x  {%- endif -%} ]",
    "ws_loop_lines": "{% for m in messages %}\n{{ m.role }}\n{% endfor %}\nend",
    "ws_comment": "a {# c #}\n  b {#- c -#} c\n  {# line #}\nd",
    "ws_plus": "{% if true +%}\nx\n   {%+ endif %}|",
    "ws_output": "  {{ 'x' }}  \n  {{- 'y' -}}  \n z",
    "ws_crlf": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n",
    "ws_trailing_newline": "x\n",
    "ws_indented_blocks": "{%- for m in messages %}\n    {%- if m.role == 'user' %}\n        <{{ m.content }}>\n    {%- endif %}\n{%- endfor %}",
    # operators and literals
    "arith": "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} "
             "{{ 7 / 2 }} {{ 1.5 + 1 }} {{ -n }} {{ n - f }} {{ 10 / 4 * 2 }}",
    "concat": "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ 'x' + 'y' }}",
    "compare": "{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} "
               "{{ 'role' in messages[0] }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} "
               "{{ true == 1 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ none == none }} {{ 'a' != 'a' }}",
    "logic": "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ not '' }} {{ not 1 and 2 }} "
             "{{ (1 or 0) and 'z' }}",
    "repr": "{{ none }} {{ true }} {{ [1, 'a', none, true, 1.0, \"it's\"] }} "
            "{{ {'k': 'v', 'n': [1]} }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 123456789.125 }} "
            "{{ 1e16 }} {{ 1.0 }} {{ -0.5 }} {{ 100.0 / 3 }} {{ d }}",
    "literals": "{{ 'a\\tb\\u00e9\\x41\\'' }} {{ \"q\\\"q\" }} {{ 'adj' 'acent' }} {{ 1_000 }} "
                "{{ (1, 2) }} {{ [] }} {{ {} }} {{ True }} {{ None }}",
    "condexpr": "{{ 'y' if n > 5 else 'n' }}|{{ 'y' if false }}|{{ 'a' if none else 'b' if 1 else 'c' }}",
    "nested_braces": "{{ {'a': {'b': 1}}['a']['b'] }} {{ '}}' }} {{ \"%}\" }}",
    # filters
    "f_trim_len": "[{{ '  x y \\n' | trim }}] {{ u | length }} {{ items | length }} {{ d | length }} "
                  "{{ 'xxhixx' | trim('x') }} {{ undefined_name | length }}",
    "f_join": "{{ items | join(', ') }} {{ ['a', 'b'] | join }} {{ people | join('/', attribute='name') }}",
    "f_case": "{{ s | upper }} {{ s | lower }} {{ 'hello wORLD' | title }} {{ 'hELLO' | capitalize }}",
    "f_default": "{{ missing | default('dflt') }} {{ empty | default('e') }} {{ empty | default('e', true) }} "
                 "{{ nothing | d('n') }} {{ n | default(0) }}",
    "f_first_last": "{{ items | first }} {{ items | last }} {{ 'abc' | first }} {{ messages | last | tojson }}",
    "f_list_string": "{{ 'abc' | list }} {{ 12 | string }} {{ d | list }} {{ items | reverse | list }} {{ 'abc' | reverse }}",
    "f_replace": "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }}",
    "f_numbers": "{{ '42' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.9 | int }} {{ '2.5' | float }} "
                 "{{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ items | sum }} {{ items | min }} {{ items | max }}",
    "f_unique_sort": "{{ items | unique | list }} {{ items | sort }} {{ items | sort(reverse=true) }} "
                     "{{ people | sort(attribute='age') | map(attribute='name') | list }}",
    "f_select": "{{ items | select('odd') | list }} {{ items | reject('equalto', 3) | list }} "
                "{{ people | selectattr('admin') | map(attribute='name') | list }} "
                "{{ people | rejectattr('name', 'equalto', 'Bob') | map(attribute='name') | join(',') }} "
                "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
                "{{ people | selectattr('admin', 'undefined') | list | length }}",
    "f_map": "{{ people | map(attribute='name') | join(' ') }} {{ ['a', 'B'] | map('upper') | list }} "
             "{{ people | map(attribute='admin', default=false) | list }}",
    "f_items": "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %} {{ d | dictsort }}",
    "f_tojson": "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|"
                "{{ u | tojson }}|{{ u | tojson(ensure_ascii=true) }}|{{ [1.5, none, true, 'q\"\\n'] | tojson }}|"
                "{{ d | tojson(separators=(',', ':')) }}|{{ {} | tojson(indent=2) }}|{{ people | tojson(indent='\\t') }}",
    "f_indent_wordcount": "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ s | wordcount }}",
    # tests
    "tests": "{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ nothing is none }} "
             "{{ s is string }} {{ d is mapping }} {{ items is iterable }} {{ s is iterable }} "
             "{{ n is number }} {{ n is integer }} {{ f is float }} {{ true is boolean }} "
             "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby(3) }} {{ 9 is divisibleby 4 }} "
             "{{ n is equalto 7 }} {{ n is eq(8) }} {{ 'abc' is lower }} {{ 'ABC' is upper }} "
             "{{ 2 is in(items) }} {{ nothing is sameas none }} {{ d is not mapping }} {{ n is not none }} "
             "{{ true is true }} {{ 0 is false }} {{ n is gt(3) }} {{ n is lt 3 }}",
    # methods
    "m_string": "[{{ '  x  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] "
                "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} "
                "{{ s.startswith('Hell') }} {{ s.endswith(('x', 'World')) }} {{ s.replace('l', 'L') }} "
                "{{ s.upper() }} {{ s.lower() }} {{ s.find('World') }} {{ s.count('l') }} {{ '-'.join(['a', 'b']) }} "
                "{{ 'l1\\nl2\\r\\nl3'.splitlines() }} {{ 'hello world'.title() }} {{ '123'.isdigit() }}",
    "m_dict": "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}{{ d.keys() | list }} {{ d.values() | list }} "
              "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dv') }}",
    # subscripts and slices
    "slices": "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ messages[-1].content }} {{ [1, 2, 3, 4, 5][1::2] }} "
              "{{ u[1] }} {{ u[-3:] }} {{ messages[1:] | length }} {{ items[:-1] }} {{ items[10] is defined }} "
              "{{ messages[0]['role'] }} {{ d.c[1].x }} {{ d['c'][0] }} {{ items.0 }}",
    # loops
    "loop_vars": "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
                 "{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/"
                 "{{ loop.previtem.role if loop.previtem is defined else '-' }}/"
                 "{{ loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %}",
    "loop_filter_else": "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% endfor %}"
                        "{% for x in [] %}never{% else %}empty{% endfor %}",
    "loop_break_continue": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                           "{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "loop_unpack_nested": "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% for c in 'xy' %}{{ loop.index }}{{ c }}"
                          "{% endfor %}{{ loop.index }};{% endfor %}",
    "loop_scope": "{% set x = 'outer' %}{% for i in [1, 2] %}{% set x = 'inner' ~ i %}{{ x }} {% endfor %}{{ x }}",
    "loop_dict_string": "{% for k in d %}{{ k }}{% endfor %} {% for ch in u %}[{{ ch }}]{% endfor %}",
    "namespace": "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}"
                 "{% if m.role == 'user' %}{% set ns.count = ns.count + 1 %}{% set ns.found = true %}{% endif %}"
                 "{% endfor %}{{ ns.count }} {{ ns.found }}",
    "set_forms": "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set x %}a{{ 1 }}b{% endset %}[{{ x }}] "
                 "{% set l = [1, 2] %}{{ l }} {% if true %}{% set inner = 5 %}{% endif %}{{ inner }}",
    "macro": "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
             "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}",
    "raw_generation": "{% raw %}{{ not rendered }} {% if %}{% endraw %} {% generation %}gen{% endgeneration %}",
    "range_dict": "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} "
                  "{{ dict(a=1, b='x') }} {{ namespace(z=1).z }}",
    "special_vars": "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}",
    "message_attrs": "{% for m in messages %}{{ m.role }}:{{ m['content'] }}:{{ m.tool_calls is defined }};{% endfor %}",
    # errors (any error is enough: messages differ between jinja2 and us)
    "err_raise": "{{ raise_exception('custom failure') }}",
    "err_undefined_add": "{{ zz + 1 }}",
    "err_type_add": "{{ 'a' + 1 }}",
    "err_undefined_attr": "{{ zz.attr }}",
    "err_undefined_index": "{{ messages[10]['role'] }}",
    "err_not_iterable": "{% for x in 5 %}{% endfor %}",
    "err_div_zero": "{{ 1 // 0 }}",
}


def render(template, messages, add_generation_prompt, bos, eos, extra):
    try:
        out, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                       add_generation_prompt=add_generation_prompt,
                                       bos_token=bos, eos_token=eos, **extra)
        return {"expected": out[0]}
    except Exception as e:  # noqa: BLE001 - the golden records that it fails
        return {"error": f"{type(e).__name__}: {e}"}


def write_fixture_configs():
    out_dir = os.path.join(DATA, "tokenizer_configs")
    os.makedirs(out_dir, exist_ok=True)
    for model, template_name in FIXTURE_TEMPLATES.items():
        with open(os.path.join(REPO, "models", "test", model, "tokenizer_config.json"),
                  encoding="utf-8") as f:
            cfg = json.load(f)
        with open(os.path.join(DATA, "templates", template_name + ".jinja"), encoding="utf-8") as f:
            cfg["chat_template"] = f.read()
        with open(os.path.join(out_dir, model + ".json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)
            f.write("\n")


def main():
    write_fixture_configs()
    cases = []
    for name, convs, extra in MODEL_CASES:
        with open(os.path.join(DATA, "templates", name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        bos, eos = SPECIAL_TOKENS[name]
        for conv in convs:
            for agp in (True, False):
                case = {"template": name, "conversation": conv, "add_generation_prompt": agp,
                        "bos_token": bos, "eos_token": eos, "extra": extra}
                case.update(render(template, CONVERSATIONS[conv], agp, bos, eos, extra))
                cases.append(case)
    features = []
    for name, template in FEATURES.items():
        case = {"name": name, "template": template, "conversation": "multi",
                "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
                "extra": FEATURE_EXTRA}
        case.update(render(template, CONVERSATIONS["multi"], True, "<s>", "</s>", FEATURE_EXTRA))
        features.append(case)
    out = {"generated_by": "tests/chat/gen_goldens.py (transformers render_jinja_template)",
           "conversations": CONVERSATIONS, "cases": cases, "features": features}
    path = os.path.join(DATA, "goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases + features)
    print(f"wrote {path}: {len(cases)} model cases, {len(features)} feature cases, {errors} errors")


if __name__ == "__main__":
    main()
