#include "openapi.h"

#include "core/error.h"

namespace qs::server {

namespace {

// The document, with a few numbers patched in at start-up (see openapi_document). Written as JSON
// rather than built in code so that it reads like the API it describes.
constexpr const char* kDocument = R"JSON({
  "openapi": "3.1.0",
  "info": {
    "title": "quantspec OpenAI-compatible server",
    "version": "1",
    "description": "Completions and chat completions (streaming with Server-Sent Events or not) for one model. Unknown request fields are rejected (400 unknown_parameter); OpenAI fields this server does not implement are accepted only at their neutral value. Errors have the OpenAI shape {\"error\": {\"message\", \"type\", \"param\", \"code\"}}."
  },
  "paths": {
    "/health": {
      "get": {
        "operationId": "health",
        "summary": "Liveness: 200 while serving, 503 while shutting down.",
        "responses": {
          "200": {"description": "Serving.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}},
          "503": {"description": "Shutting down.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}}
        }
      }
    },
    "/v1/models": {
      "get": {
        "operationId": "listModels",
        "summary": "The one model this server serves.",
        "responses": {
          "200": {"description": "Model list.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}}}
        }
      }
    },
    "/v1/completions": {
      "post": {
        "operationId": "createCompletion",
        "summary": "Complete a prompt (text or token ids).",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}}},
        "responses": {
          "200": {
            "description": "The completion (application/json), or with stream=true a text/event-stream of completion chunks ending with data: [DONE].",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/CompletionResponse"}},
              "text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEvent"}}
            }
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "408": {"$ref": "#/components/responses/Timeout"},
          "413": {"$ref": "#/components/responses/TooLarge"},
          "429": {"$ref": "#/components/responses/QueueFull"},
          "503": {"$ref": "#/components/responses/Unavailable"}
        }
      }
    },
    "/v1/chat/completions": {
      "post": {
        "operationId": "createChatCompletion",
        "summary": "Answer a conversation, formatted with the model's chat template.",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}},
        "responses": {
          "200": {
            "description": "The chat completion (application/json), or with stream=true a text/event-stream of chunks ending with data: [DONE].",
            "content": {
              "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionResponse"}},
              "text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEvent"}}
            }
          },
          "400": {"$ref": "#/components/responses/BadRequest"},
          "408": {"$ref": "#/components/responses/Timeout"},
          "413": {"$ref": "#/components/responses/TooLarge"},
          "429": {"$ref": "#/components/responses/QueueFull"},
          "503": {"$ref": "#/components/responses/Unavailable"}
        }
      }
    },
    "/tokenize": {
      "post": {
        "operationId": "tokenize",
        "summary": "The token ids a prompt (or a conversation, through the chat template) runs as, and the context: does a long document fit?",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TokenizeRequest"}}}},
        "responses": {
          "200": {"description": "The ids.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TokenizeResponse"}}}},
          "400": {"$ref": "#/components/responses/BadRequest"},
          "413": {"$ref": "#/components/responses/TooLarge"}
        }
      }
    },
    "/detokenize": {
      "post": {
        "operationId": "detokenize",
        "summary": "The text of token ids (special tokens included).",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DetokenizeRequest"}}}},
        "responses": {
          "200": {"description": "The text.", "content": {"application/json": {"schema": {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}}}},
          "400": {"$ref": "#/components/responses/BadRequest"},
          "413": {"$ref": "#/components/responses/TooLarge"}
        }
      }
    },
    "/metrics": {
      "get": {
        "operationId": "metrics",
        "summary": "Prometheus metrics (text exposition format 0.0.4).",
        "responses": {"200": {"description": "Metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}}}
      }
    },
    "/openapi.json": {
      "get": {
        "operationId": "openapi",
        "summary": "This document.",
        "responses": {"200": {"description": "OpenAPI 3.1 document.", "content": {"application/json": {"schema": {"type": "object"}}}}}
      }
    }
  },
  "components": {
    "responses": {
      "BadRequest": {"description": "Invalid request (malformed JSON, wrong types, missing or unknown fields, unsupported values, prompt longer than the context).", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "Timeout": {"description": "The request did not finish within the server's per-request timeout.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "TooLarge": {"description": "The request body exceeds the server's limit.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "QueueFull": {"description": "The request queue is full; retry later.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "Unavailable": {"description": "The server is shutting down.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    },
    "schemas": {
      "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
          "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
              "message": {"type": "string"},
              "type": {"type": "string"},
              "param": {"type": ["string", "null"]},
              "code": {"type": ["string", "null"]}
            }
          }
        }
      },
      "StreamEvent": {
        "type": "object",
        "description": "One Server-Sent Event. data is a chunk object (JSON), an error object {\"error\": ...} if generation fails after the stream started, or the final [DONE].",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}
      },
      "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string", "enum": ["ok", "shutting_down"]}}},
      "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
          "object": {"const": "list"},
          "data": {
            "type": "array",
            "items": {
              "type": "object",
              "required": ["id", "object", "created", "owned_by"],
              "properties": {
                "id": {"type": "string"},
                "object": {"const": "model"},
                "created": {"type": "integer"},
                "owned_by": {"type": "string"},
                "max_model_len": {"type": "integer"}
              }
            }
          }
        }
      },
      "TokenIds": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 0}},
      "Stop": {
        "oneOf": [
          {"type": "null"},
          {"type": "string", "minLength": 1},
          {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}}
        ]
      },
      "TokenizeRequest": {
        "type": "object",
        "additionalProperties": false,
        "oneOf": [{"required": ["prompt"], "not": {"required": ["tools"]}}, {"required": ["messages"]}],
        "properties": {
          "model": {"type": ["string", "null"]},
          "prompt": {"type": "string"},
          "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}},
          "tools": {"type": ["array", "null"], "maxItems": 128, "items": {"$ref": "#/components/schemas/Tool"}, "description": "With messages: the tools the chat template shows."},
          "add_special_tokens": {"type": ["boolean", "null"], "description": "Default: true for a prompt (as /v1/completions), false for messages (the chat template writes them)."}
        }
      },
      "TokenizeResponse": {
        "type": "object",
        "required": ["count", "max_model_len", "tokens"],
        "properties": {
          "count": {"type": "integer", "minimum": 0},
          "max_model_len": {"type": "integer", "minimum": 1},
          "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}
        }
      },
      "DetokenizeRequest": {
        "type": "object",
        "additionalProperties": false,
        "required": ["tokens"],
        "properties": {
          "model": {"type": ["string", "null"]},
          "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 0}}
        }
      },
      "LogitBias": {
        "type": ["object", "null"],
        "description": "Token id (a decimal string) -> a bias added to its logit before sampling.",
        "maxProperties": 300,
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}
      },
      "StreamOptions": {
        "type": ["object", "null"],
        "additionalProperties": false,
        "properties": {"include_usage": {"type": ["boolean", "null"]}}
      },
      "CompletionRequest": {
        "type": "object",
        "additionalProperties": false,
        "required": ["prompt"],
        "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then": {"required": ["stream"], "properties": {"stream": {"const": true}}},
        "properties": {
          "model": {"type": ["string", "null"], "description": "Ignored: the server serves one model."},
          "prompt": {
            "oneOf": [
              {"type": "string"},
              {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string"}},
              {"$ref": "#/components/schemas/TokenIds"},
              {"type": "array", "minItems": 1, "maxItems": 64, "items": {"$ref": "#/components/schemas/TokenIds"}}
            ]
          },
          "max_tokens": {"type": ["integer", "null"], "minimum": 0, "maximum": 0, "description": "At least 1, or 0 with echo (the prompt alone)."},
          "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
          "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
          "top_k": {"type": ["integer", "null"], "minimum": -1, "maximum": 2147483647, "description": "Extension: keep the k most likely tokens (0 or -1: off)."},
          "min_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1, "description": "Extension."},
          "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 16, "description": "Choices, generated one after another (seeds seed, seed + 1, ...)."},
          "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
          "stream": {"type": ["boolean", "null"]},
          "stream_options": {"$ref": "#/components/schemas/StreamOptions"},
          "stop": {"$ref": "#/components/schemas/Stop"},
          "seed": {"type": ["integer", "null"]},
          "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2, "description": "Subtracted from the logit of every token generated so far (the prompt's are not counted)."},
          "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2, "description": "Times its count so far, subtracted from each generated token's logit."},
          "logit_bias": {"$ref": "#/components/schemas/LogitBias"},
          "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5, "description": "Each generated token's log-probability under the target model's distribution (after penalties and logit_bias, before temperature and truncation), with this many alternatives."},
          "echo": {"type": ["boolean", "null"], "description": "Each choice's text starts with the prompt; with logprobs the prompt's tokens get log-probabilities too (the first null), computed by a scoring pass over the prompt before generation."},
          "suffix": {"type": ["string", "null"]},
          "user": {"type": ["string", "null"]},
          "ignore_eos": {"type": ["boolean", "null"], "description": "Extension: do not stop at end-of-sequence tokens."},
          "response_format": {"$ref": "#/components/schemas/ResponseFormat"}
        }
      },
      "ContentPart": {
        "type": "object",
        "additionalProperties": false,
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}
      },
      "Content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/components/schemas/ContentPart"}}]},
      "ResponseFormat": {
        "type": ["object", "null"],
        "additionalProperties": false,
        "required": ["type"],
        "properties": {
          "type": {"enum": ["text", "json_object", "json_schema"], "description": "json_object: the message is one JSON object (JSON mode); json_schema: one JSON document that json_schema.schema accepts (structured outputs). The tokens that cannot continue one are masked in every row, the draft's and the target's alike, so QuantSpec stays exact; the message ends as the document completes."},
          "json_schema": {
            "type": "object",
            "additionalProperties": false,
            "required": ["name"],
            "description": "With type json_schema only.",
            "properties": {
              "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
              "description": {"type": "string"},
              "schema": {"type": ["object", "boolean"], "description": "A JSON Schema (the supported keywords: the server's README); absent: any JSON value. Properties are generated in the order given."},
              "strict": {"type": ["boolean", "null"], "description": "Accepted; the schema is always followed."}
            }
          }
        }
      },
      "FunctionName": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
      "Tool": {
        "type": "object",
        "additionalProperties": false,
        "required": ["type", "function"],
        "properties": {
          "type": {"const": "function"},
          "function": {
            "type": "object",
            "additionalProperties": false,
            "required": ["name"],
            "properties": {
              "name": {"$ref": "#/components/schemas/FunctionName"},
              "description": {"type": ["string", "null"]},
              "parameters": {"type": ["object", "null"], "description": "A JSON Schema of the arguments object; absent: none. With tool_choice required or naming this function, the arguments are generated to follow it (the supported keywords: the server's README)."},
              "strict": {"type": ["boolean", "null"], "description": "Accepted; a call that tool_choice forces always follows its schema."}
            }
          }
        }
      },
      "ToolCall": {
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "function"],
        "properties": {
          "id": {"type": "string"},
          "type": {"const": "function"},
          "function": {
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "arguments"],
            "properties": {
              "name": {"$ref": "#/components/schemas/FunctionName"},
              "arguments": {"type": "string", "description": "The JSON text of an object (empty: none)."}
            }
          }
        }
      },
      "ChatMessage": {
        "description": "system (or developer), user, assistant and tool messages; an assistant message may omit its content.",
        "oneOf": [
          {
            "type": "object",
            "additionalProperties": false,
            "required": ["role", "content"],
            "properties": {
              "role": {"type": "string", "enum": ["system", "developer", "user"]},
              "content": {"$ref": "#/components/schemas/Content"},
              "name": {"type": ["string", "null"]}
            }
          },
          {
            "type": "object",
            "additionalProperties": false,
            "required": ["role"],
            "properties": {
              "role": {"const": "assistant"},
              "content": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Content"}]},
              "name": {"type": ["string", "null"]},
              "refusal": {"type": ["string", "null"]},
              "tool_calls": {"type": ["array", "null"], "items": {"$ref": "#/components/schemas/ToolCall"}},
              "function_call": {"type": "null"},
              "audio": {"type": "null"}
            }
          },
          {
            "type": "object",
            "additionalProperties": false,
            "required": ["role", "content", "tool_call_id"],
            "properties": {
              "role": {"const": "tool"},
              "content": {"$ref": "#/components/schemas/Content"},
              "tool_call_id": {"type": "string"},
              "name": {"type": ["string", "null"]}
            }
          }
        ]
      },
      "ChatCompletionRequest": {
        "type": "object",
        "additionalProperties": false,
        "required": ["messages"],
        "allOf": [
          {
            "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
            "then": {"required": ["stream"], "properties": {"stream": {"const": true}}}
          },
          {
            "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": true}}}
          }
        ],
        "properties": {
          "model": {"type": ["string", "null"], "description": "Ignored: the server serves one model."},
          "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}},
          "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 0},
          "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 0},
          "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
          "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
          "top_k": {"type": ["integer", "null"], "minimum": -1, "maximum": 2147483647},
          "min_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
          "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 16, "description": "Choices, generated one after another (seeds seed, seed + 1, ...)."},
          "stream": {"type": ["boolean", "null"]},
          "stream_options": {"$ref": "#/components/schemas/StreamOptions"},
          "stop": {"$ref": "#/components/schemas/Stop"},
          "seed": {"type": ["integer", "null"]},
          "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2, "description": "Subtracted from the logit of every token generated so far (the prompt's are not counted)."},
          "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2, "description": "Times its count so far, subtracted from each generated token's logit."},
          "logit_bias": {"$ref": "#/components/schemas/LogitBias"},
          "logprobs": {"type": ["boolean", "null"], "description": "Each generated token's log-probability under the target model's distribution (after penalties and logit_bias, before temperature and truncation)."},
          "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20, "description": "Alternatives per token; needs logprobs: true."},
          "tools": {"type": ["array", "null"], "maxItems": 128, "items": {"$ref": "#/components/schemas/Tool"}, "description": "The chat template shows them to the model (its `tools`)."},
          "tool_choice": {
            "description": "none; auto (the default with tools: calls the model writes in its template's format are returned as tool_calls); required (the reply is generated as calls of the given tools, at most 64 tools); or a named function (the reply is generated as its arguments).",
            "oneOf": [
              {"type": ["string", "null"], "enum": ["none", "auto", "required", null]},
              {
                "type": "object",
                "additionalProperties": false,
                "required": ["type", "function"],
                "properties": {
                  "type": {"const": "function"},
                  "function": {"type": "object", "additionalProperties": false, "required": ["name"], "properties": {"name": {"$ref": "#/components/schemas/FunctionName"}}}
                }
              }
            ]
          },
          "parallel_tool_calls": {"type": ["boolean", "null"], "description": "false: tool_choice required makes one call."},
          "functions": {"type": ["array", "null"], "maxItems": 0},
          "function_call": {"type": ["string", "null"], "enum": ["none", "auto", null]},
          "response_format": {"$ref": "#/components/schemas/ResponseFormat"},
          "user": {"type": ["string", "null"]},
          "ignore_eos": {"type": ["boolean", "null"]}
        }
      },
      "Usage": {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
          "prompt_tokens": {"type": "integer", "minimum": 0},
          "completion_tokens": {"type": "integer", "minimum": 0},
          "total_tokens": {"type": "integer", "minimum": 0},
          "prompt_tokens_details": {
            "type": "object",
            "description": "cached_tokens: prompt tokens the prompt cache kept from the previous request (--prompt-cache).",
            "required": ["cached_tokens"],
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}}
          }
        }
      },
      "QuantspecStats": {
        "type": "object",
        "description": "Extension: timing and speculative-decoding statistics of this response.",
        "required": ["mode", "speculative"],
        "properties": {
          "mode": {"type": "string", "enum": ["ar", "quantspec"]},
          "queue_s": {"type": "number"},
          "prefill_s": {"type": "number"},
          "decode_s": {"type": "number"},
          "decode_tokens_per_s": {"type": "number"},
          "speculative": {
            "type": "object",
            "required": ["drafted_tokens", "accepted_tokens", "acceptance_rate"],
            "properties": {
              "drafted_tokens": {"type": "integer", "minimum": 0},
              "accepted_tokens": {"type": "integer", "minimum": 0},
              "acceptance_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
              "rounds": {"type": "integer", "minimum": 0},
              "mean_accepted_length": {"type": ["number", "null"]}
            }
          }
        }
      },
      "CompletionResponse": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
          "id": {"type": "string"},
          "object": {"const": "text_completion"},
          "created": {"type": "integer"},
          "model": {"type": "string"},
          "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
              "type": "object",
              "required": ["index", "text", "finish_reason"],
              "properties": {
                "index": {"type": "integer"},
                "text": {"type": "string"},
                "logprobs": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/CompletionLogprobs"}]},
                "finish_reason": {"type": "string", "enum": ["stop", "length"]}
              }
            }
          },
          "usage": {"$ref": "#/components/schemas/Usage"},
          "quantspec": {"$ref": "#/components/schemas/QuantspecStats"}
        }
      },
      "ChatCompletionResponse": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
          "id": {"type": "string"},
          "object": {"const": "chat.completion"},
          "created": {"type": "integer"},
          "model": {"type": "string"},
          "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
              "type": "object",
              "required": ["index", "message", "finish_reason"],
              "properties": {
                "index": {"type": "integer"},
                "message": {
                  "type": "object",
                  "required": ["role", "content"],
                  "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"], "description": "null when the reply is only tool calls."},
                    "tool_calls": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ToolCall"}}
                  }
                },
                "logprobs": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/ChatLogprobs"}]},
                "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"]}
              }
            }
          },
          "usage": {"$ref": "#/components/schemas/Usage"},
          "quantspec": {"$ref": "#/components/schemas/QuantspecStats"}
        }
      },
      "CompletionLogprobs": {
        "type": "object",
        "description": "One entry per generated token: its text, log-probability, the alternatives with the token itself, its offset in code points.",
        "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
        "properties": {
          "tokens": {"type": "array", "items": {"type": "string"}},
          "token_logprobs": {"type": "array", "items": {"type": ["number", "null"], "maximum": 0}, "description": "null for an echoed prompt's first token."},
          "top_logprobs": {"type": "array", "items": {"type": ["object", "null"], "additionalProperties": {"type": "number", "maximum": 0}}},
          "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}}
        }
      },
      "TokenLogprob": {
        "type": "object",
        "required": ["token", "logprob", "bytes"],
        "properties": {
          "token": {"type": "string"},
          "logprob": {"type": "number", "maximum": 0},
          "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}
        }
      },
      "ChatLogprobs": {
        "type": "object",
        "required": ["content"],
        "properties": {
          "content": {
            "type": "array",
            "items": {
              "allOf": [
                {"$ref": "#/components/schemas/TokenLogprob"},
                {
                  "type": "object",
                  "required": ["top_logprobs"],
                  "properties": {"top_logprobs": {"type": "array", "items": {"$ref": "#/components/schemas/TokenLogprob"}}}
                }
              ]
            }
          },
          "refusal": {"type": "null"}
        }
      }
    }
  }
})JSON";

}  // namespace

Json openapi_document(const OpenApiLimits& limits) {
  Json doc = Json::parse(kDocument, nullptr, /*allow_exceptions=*/false);
  QS_CHECK_MSG(!doc.is_discarded(), "the built-in OpenAPI document is not valid JSON");
  Json& schemas = doc["components"]["schemas"];
  const int max_tokens = std::max(1, limits.max_context);
  schemas["CompletionRequest"]["properties"]["max_tokens"]["maximum"] = max_tokens;
  schemas["ChatCompletionRequest"]["properties"]["max_tokens"]["maximum"] = max_tokens;
  schemas["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["maximum"] = max_tokens;
  schemas["TokenIds"]["items"]["maximum"] = std::max(0, limits.vocab_size - 1);
  schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] =
      std::max(0, limits.vocab_size - 1);
  doc["info"]["description"] =
      doc["info"]["description"].get<std::string>() + " Model: " + limits.model_name +
      ", context " + std::to_string(limits.max_context) + " tokens, request bodies up to " +
      std::to_string(limits.max_body_bytes) + " bytes.";
  return doc;
}

}  // namespace qs::server
