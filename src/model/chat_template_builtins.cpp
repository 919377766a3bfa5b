#include "model/chat_template_builtins.h"

namespace qs::chat_template_internal {

// ------------------------------------------------------------------------------------------------
// Built-in templates (our own, equivalent to the public model templates they are named after;
// tests/chat compares them with HF renders of those templates)
// ------------------------------------------------------------------------------------------------

// Llama-2-chat: the system prompt goes into the first user turn inside <<SYS>> markers.
constexpr const char* kLlama2Template = R"JINJA(
{%- if messages[0]['role'] == 'system' -%}
  {%- set system_message = messages[0]['content'] -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set system_message = none -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('llama2 template: after an optional system message, roles must alternate user/assistant/user/...') -}}
  {%- endif -%}
  {%- set content = message['content'] -%}
  {%- if loop.first and system_message is not none -%}
    {%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + content -%}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}
  {%- else -%}
    {{- ' ' + content | trim + ' ' + eos_token -}}
  {%- endif -%}
{%- endfor -%}
)JINJA";

// Llama-3-Instruct: header-delimited turns closed by <|eot_id|>.
constexpr const char* kLlama3Template = R"JINJA(
{%- for message in messages -%}
  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
)JINJA";

// Mistral-Instruct v0.1/v0.2 layout; a leading system message is folded into the first user turn.
constexpr const char* kMistralTemplate = R"JINJA(
{%- if messages[0]['role'] == 'system' -%}
  {%- set system_message = messages[0]['content'] -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set system_message = none -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('mistral template: after an optional system message, roles must alternate user/assistant/user/...') -}}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {%- if loop.first and system_message is not none -%}
      {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' -}}
    {%- else -%}
      {{- '[INST] ' + message['content'] + ' [/INST]' -}}
    {%- endif -%}
  {%- else -%}
    {{- message['content'] + eos_token -}}
  {%- endif -%}
{%- endfor -%}
)JINJA";

// ChatML (Qwen2 and many others), without an implicit default system prompt.
constexpr const char* kChatmlTemplate = R"JINJA(
{%- for message in messages -%}
  {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
)JINJA";

const std::vector<std::pair<std::string, const char*>>& builtin_templates() {
  static const std::vector<std::pair<std::string, const char*>> t = {{"llama2", kLlama2Template},
                                                                     {"llama3", kLlama3Template},
                                                                     {"mistral", kMistralTemplate},
                                                                     {"chatml", kChatmlTemplate}};
  return t;
}

}  // namespace qs::chat_template_internal
