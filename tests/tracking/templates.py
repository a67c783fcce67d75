"""Chat templates used as test fixtures (condensed versions of the public templates' structure).

- ``CHATML_TOOLS``: ChatML as in Qwen2.5 / SmolLM2-style models: tools listed in the system prompt inside
  ``<tools>``, Hermes ``<tool_call>`` JSON for assistant tool calls, consecutive tool results grouped into one
  user turn of ``<tool_response>`` blocks.
- ``LLAMA3_TOOLS``: Llama-3.1 style: ``<|start_header_id|>role<|end_header_id|>\\n\\n`` headers, ``<|eot_id|>``,
  a system block with dates and the tools as indented JSON, ``| trim`` on contents, tool results as ``ipython``.
- ``GEMMA_TOOLS``: Gemma style: ``<start_of_turn>user|model``, ``<end_of_turn>``, no system role (the system prompt
  and the tools are folded into the first user turn), strict user/model alternation (tool results count as user).
- ``CHATML_STRIP_THINKING``: ChatML that drops ``<think>...</think>`` from assistant messages when re-rendering,
  the way reasoning-model templates do: it breaks the prefix property on purpose.

Each template names the special tokens it needs (added to the tiny test tokenizer) and its end-of-turn token.
"""

from __future__ import annotations

import copy
from typing import Any

CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'user' or message['role'] == 'system' "
    "or (message['role'] == 'assistant' and not message.get('tool_calls')) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.get('content') %}{{- message['content'] + '\\n' }}{%- endif %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set f = tc['function'] if tc.get('function') else tc %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_SPECIAL = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CHATML_EOT = "<|im_end|>"

LLAMA3_TOOLS = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{%- if tools %}"
    "{{- 'You have access to the following functions. To call a function, respond with JSON for a function call '"
    " + 'in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{%- endif %}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' or message['role'] == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- elif message.get('tool_calls') %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- if message.get('content') %}{{- message['content'] | trim }}{{- '\\n' }}{%- endif %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set f = tc['function'] if tc.get('function') else tc %}"
    "{{- '{\"name\": \"' + f['name'] + '\", \"parameters\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_BOS = "<|begin_of_text|>"
LLAMA3_EOT = "<|eot_id|>"

GEMMA_TOOLS = (
    "{{- bos_token }}"
    "{%- set ns = namespace(prefix='') %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set ns.prefix = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if tools %}"
    "{%- set ns.prefix = ns.prefix + 'Tools (reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>):\\n' %}"
    "{%- for t in tools %}{%- set ns.prefix = ns.prefix + (t | tojson) + '\\n' %}{%- endfor %}"
    "{%- set ns.prefix = ns.prefix + '\\n' %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{%- if (role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{{- '<start_of_turn>' + role + '\\n' + (ns.prefix if loop.first else '') }}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<tool_response>\\n' + message['content'] | trim + '\\n</tool_response>' }}"
    "{%- else %}{{- message['content'] | trim }}{%- endif %}"
    "{%- if message.get('tool_calls') %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set f = tc['function'] if tc.get('function') else tc %}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
GEMMA_SPECIAL = ["<bos>", "<start_of_turn>", "<end_of_turn>", "<tool_call>", "</tool_call>"]
GEMMA_BOS = "<bos>"
GEMMA_EOT = "<end_of_turn>"

CHATML_STRIP_THINKING = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# name -> (template, special tokens to add, bos token or None, end-of-turn token)
TEMPLATES = {
    "chatml": (CHATML_TOOLS, CHATML_SPECIAL, None, CHATML_EOT),
    "llama3": (LLAMA3_TOOLS, LLAMA3_SPECIAL, LLAMA3_BOS, LLAMA3_EOT),
    "gemma": (GEMMA_TOOLS, GEMMA_SPECIAL, GEMMA_BOS, GEMMA_EOT),
    "chatml_strip_thinking": (CHATML_STRIP_THINKING, CHATML_SPECIAL, None, CHATML_EOT),
}

# the generation prompt each template appends (used by the tests' independent oracle)
HEADERS = {
    "chatml": "<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<start_of_turn>model\n",
    "chatml_strip_thinking": "<|im_start|>assistant\n",
}

# Mistral's v3 tokenizer format (Mistral-7B-Instruct-v0.3 and its tool-calling kin), written from Mistral's
# documented rendering: ``[INST] ...[/INST]`` turns with no generation prompt, the tools as ``[AVAILABLE_TOOLS]``
# JSON before the last user turn (which also carries the system prompt), assistant tool calls as
# ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`` with ids of exactly 9 letters or digits (other
# ids are refused), ``</s>`` after every assistant turn, and tool results as
# ``[TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]``. Not in TEMPLATES (its system prompt moves to
# the last user turn, so a multi-turn chat does not keep the prefix property): the tool-family tests use it.
MISTRAL_TOOLS = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in loop_messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools and loop.index0 == ns.last_user %}"
    "{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}"
    "{%- endif %}"
    "{%- if system_message is defined and loop.index0 == ns.last_user %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '[TOOL_CALLS] [' }}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- if tc['id'] is not string or tc['id'] | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}"
    "{{- '{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": ' + (tc['function']['arguments'] | tojson)"
    " + ', \"id\": \"' + tc['id'] + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] | trim + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + (message['content'] | tojson) + ', \"call_id\": \"' "
    "+ message['tool_call_id'] + '\"}[/TOOL_RESULTS]' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
MISTRAL_SPECIAL = ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
MISTRAL_BOS = "<s>"
MISTRAL_EOT = "</s>"


def with_template(base: Any, template: str, special: list[str], bos: str | None) -> Any:
    """A copy of tokenizer ``base`` with these special tokens, BOS token and chat template."""
    tok = copy.deepcopy(base)
    tok.add_special_tokens({"additional_special_tokens": special})
    if bos:
        tok.bos_token = bos
    tok.chat_template = template
    return tok
