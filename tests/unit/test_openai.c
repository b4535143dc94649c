/* tests/unit/test_openai.c — routerd's API layer: request validation (exact
 * status, error type, param, code and message for each bad body), response and
 * stream JSON parsed back, SSE framing, stop strings, the byte-level tokenizer
 * and API key files (each failure logged once). */
#include "apikeys.h"
#include "buf.h"
#include "check.h"
#include "log.h"
#include "adapt-openai.h"
#include "ireq.h"
#include "openai.h"
#include "reply.h"
#include "rng.h"
#include "sse.h"
#include "tok_bytes.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "tandem-synthetic"

static const char *const models[] = { MODEL, "other-model", NULL };
static const td_ireq_cfg_t cfg = {
    .models = models,
    .max_body = 64 * 1024,
    .max_tokens_limit = 4096,
    .max_tokens_default = 256,
};

/* Bodies are written with ' for " to stay readable; this swaps them back. */
static char *
body_of(const char *tmpl)
{
    char *s = strdup(tmpl);
    for (char *c = s; *c; c++)
        if (*c == '\'')
            *c = '"';
    return s;
}

/* ===================================================================== */
/* Error JSON                                                             */
/* ===================================================================== */

/* e's JSON is exactly {"error":{"message","type","param","code"}} with these values
 * (param/code NULL: JSON null); the message contains substr. */
static void
check_err(const char *what, const td_openai_err_t *e, int http, const char *type,
          const char *param, const char *code, const char *substr)
{
    td_buf_t out = {0};
    CHECK_STATUS(td_openai_err_json(e, &out), TD_OK);
    json_error_t jerr;
    json_t *root = out.data ? json_loads(out.data, 0, &jerr) : NULL;
    json_t *err = json_object_get(root, "error");
    const char *msg = json_string_value(json_object_get(err, "message"));
    int before = td_check_failures;
    CHECK_EQ_INT(e->http, http);
    CHECK(json_object_size(root) == 1);
    CHECK(json_object_size(err) == 4);
    CHECK_STR(json_string_value(json_object_get(err, "type")), type);
    json_t *jp = json_object_get(err, "param"), *jc = json_object_get(err, "code");
    if (param)
        CHECK_STR(json_string_value(jp), param);
    else
        CHECK(json_is_null(jp));
    if (code)
        CHECK_STR(json_string_value(jc), code);
    else
        CHECK(json_is_null(jc));
    CHECK(msg != NULL && strstr(msg, substr) != NULL);
    if (td_check_failures != before)
        fprintf(stderr, "  in case: %s\n  got: %s\n", what, out.data ? out.data : "(none)");
    json_decref(root);
    td_buf_free(&out);
}

/* ===================================================================== */
/* Bad bodies                                                             */
/* ===================================================================== */

#define C TD_OPENAI_CHAT
#define P TD_OPENAI_COMPLETION
#define M "'model':'" MODEL "'"
#define MSG "'messages':[{'role':'user','content':'hi'}]"
#define IR "invalid_request_error"

static const struct {
    td_openai_kind_t kind;
    const char *body;
    td_status_t st;
    int http;
    const char *param, *code, *substr;
} bad_bodies[] = {
    { C, "{", TD_ERR_INVALID, 400, NULL, NULL, "could not parse the JSON body" },
    { C, "{" M "," MSG, TD_ERR_INVALID, 400, NULL, NULL, "could not parse the JSON body" },
    { C, "{" M ",}", TD_ERR_INVALID, 400, NULL, NULL, "could not parse the JSON body" },
    { C, "", TD_ERR_INVALID, 400, NULL, NULL, "could not parse the JSON body" },
    { C, "[]", TD_ERR_INVALID, 400, NULL, "invalid_type", "must be a JSON object, but got an array" },
    { C, "{}", TD_ERR_INVALID, 400, "model", "missing_required_parameter", "Missing required parameter: 'model'." },
    { C, "{'model':null," MSG "}", TD_ERR_INVALID, 400, "model", "missing_required_parameter", "'model'" },
    { C, "{'model':5," MSG "}", TD_ERR_INVALID, 400, "model", "invalid_type", "Invalid type for 'model': expected a string, but got an integer instead." },
    { C, "{'model':'gpt-9'," MSG "}", TD_ERR_NOT_FOUND, 404, NULL, "model_not_found", "The model `gpt-9` does not exist" },
    { C, "{" M "}", TD_ERR_INVALID, 400, "messages", "missing_required_parameter", "'messages'" },
    { C, "{" M ",'messages':null}", TD_ERR_INVALID, 400, "messages", "missing_required_parameter", "'messages'" },
    { C, "{" M ",'messages':{}}", TD_ERR_INVALID, 400, "messages", "invalid_type", "expected an array, but got an object" },
    { C, "{" M ",'messages':[]}", TD_ERR_INVALID, 400, "messages", "empty_array", "empty array" },
    { C, "{" M ",'messages':['hi']}", TD_ERR_INVALID, 400, "messages[0]", "invalid_type", "expected an object, but got a string" },
    { C, "{" M ",'messages':[{'content':'hi'}]}", TD_ERR_INVALID, 400, "messages[0].role", "missing_required_parameter", "'messages[0].role'" },
    { C, "{" M ",'messages':[{'role':'robot','content':'hi'}]}", TD_ERR_INVALID, 400, "messages[0].role", "invalid_value", "Invalid value: 'robot'" },
    { C, "{" M ",'messages':[{'role':3,'content':'hi'}]}", TD_ERR_INVALID, 400, "messages[0].role", "invalid_type", "got an integer" },
    { C, "{" M ",'messages':[{'role':'user','content':'a'},{'role':'user'}]}", TD_ERR_INVALID, 400, "messages[1].content", "missing_required_parameter", "'messages[1].content'" },
    { C, "{" M ",'messages':[{'role':'assistant','content':null}]}", TD_ERR_INVALID, 400, "messages[0].content", "missing_required_parameter", "content" },
    { C, "{" M ",'messages':[{'role':'user','content':7}]}", TD_ERR_INVALID, 400, "messages[0].content", "invalid_type", "expected a string or an array of content parts, but got an integer" },
    { C, "{" M ",'messages':[{'role':'user','content':[]}]}", TD_ERR_INVALID, 400, "messages[0].content", "empty_array", "empty array" },
    { C, "{" M ",'messages':[{'role':'user','content':[{'type':'text','text':'a'},{'type':'image_url','image_url':{'url':'x'}}]}]}", TD_ERR_UNSUPPORTED, 400, "messages[0].content[1].type", "unsupported_value", "only 'text'" },
    { C, "{" M ",'messages':[{'role':'user','content':[{'type':'text'}]}]}", TD_ERR_INVALID, 400, "messages[0].content[0].text", "missing_required_parameter", "text" },
    { C, "{" M ",'messages':[{'role':'user','content':['a']}]}", TD_ERR_INVALID, 400, "messages[0].content[0]", "invalid_type", "expected an object" },
    { C, "{" M ",'messages':[{'role':'user','name':1,'content':'a'}]}", TD_ERR_INVALID, 400, "messages[0].name", "invalid_type", "expected a string" },
    { C, "{" M ",'messages':[{'role':'user','content':'a'},{'role':'tool','content':'42'}]}", TD_ERR_INVALID, 400, "messages[1].tool_call_id", "missing_required_parameter", "tool_call_id" },
    { C, "{" M ",'messages':[{'role':'assistant','tool_calls':{}}]}", TD_ERR_INVALID, 400, "messages[0].tool_calls", "invalid_type", "expected an array" },
    { C, "{" M "," MSG ",'max_tokens':0}", TD_ERR_INVALID, 400, "max_tokens", "integer_below_min_value", "Expected a value >= 1, but got 0 instead." },
    { C, "{" M "," MSG ",'max_tokens':-1}", TD_ERR_INVALID, 400, "max_tokens", "integer_below_min_value", "but got -1 instead" },
    { C, "{" M "," MSG ",'max_tokens':5000}", TD_ERR_INVALID, 400, "max_tokens", "integer_above_max_value", "Expected a value <= 4096, but got 5000 instead." },
    { C, "{" M "," MSG ",'max_tokens':1.5}", TD_ERR_INVALID, 400, "max_tokens", "invalid_type", "Invalid type for 'max_tokens': expected an integer, but got a decimal instead." },
    { C, "{" M "," MSG ",'max_tokens':'10'}", TD_ERR_INVALID, 400, "max_tokens", "invalid_type", "expected an integer, but got a string instead." },
    { C, "{" M "," MSG ",'max_tokens':true}", TD_ERR_INVALID, 400, "max_tokens", "invalid_type", "but got a boolean instead" },
    { C, "{" M "," MSG ",'max_completion_tokens':0}", TD_ERR_INVALID, 400, "max_completion_tokens", "integer_below_min_value", ">= 1" },
    { C, "{" M "," MSG ",'max_tokens':10,'max_completion_tokens':20}", TD_ERR_INVALID, 400, "max_tokens", "invalid_value", "disagree" },
    { C, "{" M "," MSG ",'temperature':3}", TD_ERR_INVALID, 400, "temperature", "decimal_above_max_value", "Expected a value <= 2, but got 3 instead." },
    { C, "{" M "," MSG ",'temperature':-0.5}", TD_ERR_INVALID, 400, "temperature", "decimal_below_min_value", ">= 0, but got -0.5" },
    { C, "{" M "," MSG ",'temperature':'hot'}", TD_ERR_INVALID, 400, "temperature", "invalid_type", "expected a number, but got a string" },
    { C, "{" M "," MSG ",'top_p':0}", TD_ERR_INVALID, 400, "top_p", "decimal_below_min_value", "Expected a value > 0, but got 0" },
    { C, "{" M "," MSG ",'top_p':1.5}", TD_ERR_INVALID, 400, "top_p", "decimal_above_max_value", "<= 1" },
    { C, "{" M "," MSG ",'seed':1.5}", TD_ERR_INVALID, 400, "seed", "invalid_type", "expected an integer, but got a decimal" },
    { C, "{" M "," MSG ",'seed':'7'}", TD_ERR_INVALID, 400, "seed", "invalid_type", "got a string" },
    { C, "{" M "," MSG ",'priority':1.5}", TD_ERR_INVALID, 400, "priority", "invalid_type", "expected an integer, but got a decimal" },
    { C, "{" M "," MSG ",'priority':2147483648}", TD_ERR_INVALID, 400, "priority", "integer_above_max_value", "<= 2147483647" },
    { C, "{" M "," MSG ",'stream':'yes'}", TD_ERR_INVALID, 400, "stream", "invalid_type", "expected a boolean, but got a string" },
    { C, "{" M "," MSG ",'stream_options':{'include_usage':true}}", TD_ERR_INVALID, 400, "stream_options", "invalid_value", "only allowed when 'stream' is enabled" },
    { C, "{" M "," MSG ",'stream':true,'stream_options':{'include_usage':1}}", TD_ERR_INVALID, 400, "stream_options.include_usage", "invalid_type", "expected a boolean" },
    { C, "{" M "," MSG ",'stream':true,'stream_options':true}", TD_ERR_INVALID, 400, "stream_options", "invalid_type", "expected an object" },
    { C, "{" M "," MSG ",'stop':5}", TD_ERR_INVALID, 400, "stop", "invalid_type", "expected a string or an array of strings, but got an integer" },
    { C, "{" M "," MSG ",'stop':['a','b','c','d','e']}", TD_ERR_INVALID, 400, "stop", "array_above_max_length", "maximum length 4, but got an array with length 5" },
    { C, "{" M "," MSG ",'stop':['a',1]}", TD_ERR_INVALID, 400, "stop[1]", "invalid_type", "expected a string" },
    { C, "{" M "," MSG ",'stop':''}", TD_ERR_INVALID, 400, "stop", "invalid_value", "must not be empty" },
    { C, "{" M "," MSG ",'n':17}", TD_ERR_INVALID, 400, "n", "integer_above_max_value", "Expected a value <= 16, but got 17" },
    { C, "{" M "," MSG ",'n':0}", TD_ERR_INVALID, 400, "n", "integer_below_min_value", ">= 1" },
    { C, "{" M "," MSG ",'best_of':3}", TD_ERR_UNSUPPORTED, 400, "best_of", "unsupported_value", "best_of is not supported by this server" },
    { C, "{" M "," MSG ",'top_k':-2}", TD_ERR_INVALID, 400, "top_k", "integer_below_min_value", "Expected a value >= -1, but got -2" },
    { C, "{" M "," MSG ",'top_k':1.5}", TD_ERR_INVALID, 400, "top_k", "invalid_type", "expected an integer" },
    { C, "{" M "," MSG ",'min_p':1.5}", TD_ERR_INVALID, 400, "min_p", "decimal_above_max_value", "<= 1" },
    { C, "{" M "," MSG ",'min_p':-0.1}", TD_ERR_INVALID, 400, "min_p", "decimal_below_min_value", ">= 0" },
    { C, "{" M "," MSG ",'repetition_penalty':0}", TD_ERR_INVALID, 400, "repetition_penalty", "decimal_below_min_value", "> 0" },
    { C, "{" M "," MSG ",'repetition_penalty':2.5}", TD_ERR_INVALID, 400, "repetition_penalty", "decimal_above_max_value", "<= 2" },
    { C, "{" M "," MSG ",'frequency_penalty':-2.5}", TD_ERR_INVALID, 400, "frequency_penalty", "decimal_below_min_value", ">= -2" },
    { C, "{" M "," MSG ",'min_tokens':-1}", TD_ERR_INVALID, 400, "min_tokens", "integer_below_min_value", ">= 0" },
    { C, "{" M "," MSG ",'min_tokens':20,'max_tokens':10}", TD_ERR_INVALID, 400, "min_tokens", "invalid_value", "20 is above max_tokens (10)" },
    { C, "{" M "," MSG ",'stop_token_ids':5}", TD_ERR_INVALID, 400, "stop_token_ids", "invalid_type", "expected an array of token ids" },
    { C, "{" M "," MSG ",'stop_token_ids':[1,'x']}", TD_ERR_INVALID, 400, "stop_token_ids[1]", "invalid_type", "expected an integer (a token id)" },
    { C, "{" M "," MSG ",'stop_token_ids':[-1]}", TD_ERR_INVALID, 400, "stop_token_ids[0]", "invalid_value", "token id -1 is not a token id" },
    { C, "{" M "," MSG ",'ignore_eos':1}", TD_ERR_INVALID, 400, "ignore_eos", "invalid_type", "expected a boolean" },
    { C, "{" M "," MSG ",'skip_special_tokens':'no'}", TD_ERR_INVALID, 400, "skip_special_tokens", "invalid_type", "expected a boolean" },
    { C, "{" M "," MSG ",'include_stop_str_in_output':0}", TD_ERR_INVALID, 400, "include_stop_str_in_output", "invalid_type", "expected a boolean" },
    { C, "{" M "," MSG ",'chat_template_kwargs':{'enable_thinking':true}}", TD_ERR_UNSUPPORTED, 400, "chat_template_kwargs.enable_thinking", "unsupported_value", "takes only 'thinking'" },
    { C, "{" M "," MSG ",'chat_template_kwargs':{'thinking':'yes'}}", TD_ERR_INVALID, 400, "chat_template_kwargs.thinking", "invalid_type", "expected a boolean" },
    { C, "{" M "," MSG ",'chat_template_kwargs':[]}", TD_ERR_INVALID, 400, "chat_template_kwargs", "invalid_type", "expected an object" },
    { C, "{" M "," MSG ",'guided_json':{'type':'object'}}", TD_ERR_UNSUPPORTED, 400, "guided_json", "unsupported_value", "structured output" },
    { C, "{" M "," MSG ",'guided_regex':'a+'}", TD_ERR_UNSUPPORTED, 400, "guided_regex", "unsupported_value", "structured output" },
    { C, "{" M "," MSG ",'guided_choice':'a'}", TD_ERR_INVALID, 400, "guided_choice", "invalid_type", "expected an array" },
    { P, "{" M ",'prompt':'x','guided_grammar':'root ::= \\\"a\\\"'}", TD_ERR_UNSUPPORTED, 400, "guided_grammar", "unsupported_value", "structured output" },
    { C, "{" M "," MSG ",'structured_outputs':{'choice':['a','b']}}", TD_ERR_UNSUPPORTED, 400, "structured_outputs.choice", "unsupported_value", "structured output" },
    { C, "{" M "," MSG ",'structured_outputs':{'xml':'x'}}", TD_ERR_UNSUPPORTED, 400, "structured_outputs.xml", "unsupported_value", "json, regex, choice or grammar" },
    { C, "{" M "," MSG ",'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':{}}}}", TD_ERR_UNSUPPORTED, 400, "response_format.json_schema", "unsupported_value", "structured output" },
    { C, "{" M "," MSG ",'response_format':{'type':'yaml'}}", TD_ERR_INVALID, 400, "response_format.type", "invalid_value", "'text', 'json_object' and 'json_schema'" },
    { C, "{" M "," MSG ",'use_beam_search':true}", TD_ERR_INVALID, 400, "use_beam_search", "unsupported_parameter", "use_beam_search (a vLLM extension this server does not support" },
    { P, "{" M ",'prompt':'x','prompt_logprobs':1}", TD_ERR_INVALID, 400, "prompt_logprobs", "unsupported_parameter", "a vLLM extension" },
    { C, "{" M "," MSG ",'n':'1'}", TD_ERR_INVALID, 400, "n", "invalid_type", "expected an integer" },
    { C, "{" M "," MSG ",'foo':1}", TD_ERR_INVALID, 400, NULL, NULL, "Unrecognized request argument supplied: foo" },
    { C, "{" M "," MSG ",'prompt':'x'}", TD_ERR_INVALID, 400, NULL, NULL, "Unrecognized request argument supplied: prompt" },
    { C, "{" M "," MSG ",'logprobs':1}", TD_ERR_INVALID, 400, "logprobs", "invalid_type", "expected a boolean, but got an integer" },
    { C, "{" M "," MSG ",'top_logprobs':3}", TD_ERR_INVALID, 400, "top_logprobs", "invalid_value", "needs 'logprobs' set to true" },
    { C, "{" M "," MSG ",'logprobs':false,'top_logprobs':1}", TD_ERR_INVALID, 400, "top_logprobs", "invalid_value", "needs 'logprobs'" },
    { C, "{" M "," MSG ",'logprobs':true,'top_logprobs':21}", TD_ERR_INVALID, 400, "top_logprobs", "integer_above_max_value", "Expected a value <= 20, but got 21" },
    { C, "{" M "," MSG ",'logprobs':true,'top_logprobs':-1}", TD_ERR_INVALID, 400, "top_logprobs", "integer_below_min_value", ">= 0" },
    { C, "{" M "," MSG ",'logit_bias':[]}", TD_ERR_INVALID, 400, "logit_bias", "invalid_type", "expected an object, but got an array" },
    { C, "{" M "," MSG ",'logit_bias':{'abc':1}}", TD_ERR_INVALID, 400, "logit_bias", "invalid_value", "'abc' is not a token id" },
    { C, "{" M "," MSG ",'logit_bias':{'-1':1}}", TD_ERR_INVALID, 400, "logit_bias", "invalid_value", "'-1' is not a token id" },
    { C, "{" M "," MSG ",'logit_bias':{'5x':1}}", TD_ERR_INVALID, 400, "logit_bias", "invalid_value", "not a token id" },
    { C, "{" M "," MSG ",'logit_bias':{'99999999999':1}}", TD_ERR_INVALID, 400, "logit_bias", "invalid_value", "not a token id" },
    { C, "{" M "," MSG ",'logit_bias':{'50':101}}", TD_ERR_INVALID, 400, "logit_bias.50", "decimal_above_max_value", "<= 100, but got 101" },
    { C, "{" M "," MSG ",'logit_bias':{'50':-100.5}}", TD_ERR_INVALID, 400, "logit_bias.50", "decimal_below_min_value", ">= -100" },
    { C, "{" M "," MSG ",'logit_bias':{'50':'x'}}", TD_ERR_INVALID, 400, "logit_bias.50", "invalid_type", "expected a number" },
    { C, "{" M "," MSG ",'logit_bias':{'7':1,'07':2}}", TD_ERR_INVALID, 400, "logit_bias", "invalid_value", "token id 7 is given twice" },
    { C, "{" M "," MSG ",'response_format':{'type':'json_object'}}", TD_ERR_UNSUPPORTED, 400, "response_format.type", "unsupported_value", "structured output needs the model's tokenizer" },
    { C, "{" M "," MSG ",'tools':'x'}", TD_ERR_INVALID, 400, "tools", "invalid_type", "expected an array" },
    { C, "{" M "," MSG ",'tools':[1]}", TD_ERR_INVALID, 400, "tools[0]", "invalid_type", "expected an object" },
    { C, "{" M "," MSG ",'tool_choice':5}", TD_ERR_INVALID, 400, "tool_choice", "invalid_type", "expected a string or an object" },
    { C, "{" M "," MSG ",'presence_penalty':2.5}", TD_ERR_INVALID, 400, "presence_penalty", "decimal_above_max_value", "<= 2" },
    { C, "{" M "," MSG ",'user':5}", TD_ERR_INVALID, 400, "user", "invalid_type", "expected a string" },
    { P, "{" M "}", TD_ERR_INVALID, 400, "prompt", "missing_required_parameter", "'prompt'" },
    { P, "{" M ",'prompt':['a','b']}", TD_ERR_UNSUPPORTED, 400, "prompt", "unsupported_value", "batched prompts" },
    { P, "{" M ",'prompt':[[1,2],[3]]}", TD_ERR_UNSUPPORTED, 400, "prompt", "unsupported_value", "batched prompts" },
    { P, "{" M ",'prompt':['a',[3]]}", TD_ERR_UNSUPPORTED, 400, "prompt", "unsupported_value", "batched prompts" },
    { P, "{" M ",'prompt':[]}", TD_ERR_INVALID, 400, "prompt", "empty_array", "empty array" },
    { P, "{" M ",'prompt':[[]]}", TD_ERR_INVALID, 400, "prompt[0]", "empty_array", "Invalid 'prompt[0]': empty array" },
    { P, "{" M ",'prompt':[1,2,'x']}", TD_ERR_INVALID, 400, "prompt[2]", "invalid_type", "Invalid type for 'prompt[2]': expected an integer (a token id), but got a string" },
    { P, "{" M ",'prompt':[1,2.5]}", TD_ERR_INVALID, 400, "prompt[1]", "invalid_type", "expected an integer (a token id), but got a decimal" },
    { P, "{" M ",'prompt':[[1,[2]]]}", TD_ERR_INVALID, 400, "prompt[0][1]", "invalid_type", "got an array" },
    { P, "{" M ",'prompt':[0,-1]}", TD_ERR_INVALID, 400, "prompt[1]", "invalid_value", "Invalid 'prompt[1]': token id -1 is not a token id (0 to 2147483647)" },
    { P, "{" M ",'prompt':[2147483648]}", TD_ERR_INVALID, 400, "prompt[0]", "invalid_value", "token id 2147483648 is not a token id" },
    { P, "{" M ",'prompt':[{}]}", TD_ERR_INVALID, 400, "prompt[0]", "invalid_type", "expected a string or an array of token ids, but got an object" },
    { P, "{" M ",'prompt':5}", TD_ERR_INVALID, 400, "prompt", "invalid_type", "expected a string, an array of one string or an array of token ids" },
    { P, "{" M ",'prompt':'x','echo':true}", TD_ERR_UNSUPPORTED, 400, "echo", "unsupported_value", "echo is not supported" },
    { P, "{" M ",'prompt':'x','logprobs':6}", TD_ERR_INVALID, 400, "logprobs", "integer_above_max_value", "Expected a value <= 5, but got 6" },
    { P, "{" M ",'prompt':'x','logprobs':true}", TD_ERR_INVALID, 400, "logprobs", "invalid_type", "expected an integer" },
    { P, "{" M ",'prompt':'x','top_logprobs':2}", TD_ERR_INVALID, 400, NULL, NULL, "Unrecognized request argument supplied: top_logprobs" },
    { P, "{" M ",'prompt':'x','suffix':'y'}", TD_ERR_UNSUPPORTED, 400, "suffix", "unsupported_value", "suffix" },
    { P, "{" M ",'prompt':'x','best_of':2}", TD_ERR_UNSUPPORTED, 400, "best_of", "unsupported_value", "best_of" },
    { P, "{" M ",'prompt':'x','max_tokens':0}", TD_ERR_INVALID, 400, "max_tokens", "integer_below_min_value", ">= 1" },
    { P, "{" M ",'prompt':'x','max_completion_tokens':5}", TD_ERR_INVALID, 400, NULL, NULL, "Unrecognized request argument supplied: max_completion_tokens" },
    { P, "{" M "," MSG "}", TD_ERR_INVALID, 400, NULL, NULL, "Unrecognized request argument supplied: messages" },
    { P, "{'model':'nope','prompt':'x'}", TD_ERR_NOT_FOUND, 404, NULL, "model_not_found", "`nope`" },
    /* jansson quotes the bytes where it stopped: half of U+055E here (found by
     * tests/fuzz: the error had no JSON form, and routerd answered 500) */
    { C, "'\\\xd5\x9e", TD_ERR_INVALID, 400, NULL, NULL, "invalid escape near '\"\\?'" },
    { C, "{'model\xe9':1}", TD_ERR_INVALID, 400, NULL, NULL, "We could not parse the JSON body" },
};

static void
test_bad_bodies(void)
{
    for (size_t i = 0; i < sizeof bad_bodies / sizeof bad_bodies[0]; i++) {
        char *body = body_of(bad_bodies[i].body);
        td_ireq_t *req = NULL;
        td_openai_err_t e;
        memset(&e, 0, sizeof e);
        td_status_t st = td_adapt_openai_parse(&cfg, bad_bodies[i].kind, body, strlen(body), &req, &e);
        if (st != bad_bodies[i].st)
            fprintf(stderr, "case %zu (%s): status %s\n", i, body, td_status_str(st));
        CHECK_STATUS(st, bad_bodies[i].st);
        CHECK(req == NULL);
        check_err(body, &e, bad_bodies[i].http, IR, bad_bodies[i].param, bad_bodies[i].code,
                  bad_bodies[i].substr);
        free(body);
    }
}

/* A stop string over the cap (max-stop-bytes, 512 by default) gets a 400
 * that names the cap; one at the cap is taken. */
static void
test_stop_cap(void)
{
    td_ireq_cfg_t small = cfg;
    char body[2048], big[600];
    td_ireq_t *req = NULL;
    td_openai_err_t e;

    memset(big, 'x', sizeof big);
    big[512] = '\0';   /* at the default cap */
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],\"stop\":[\"a\",\"%s\"]}", MODEL, big);
    CHECK_STATUS(td_adapt_openai_parse(&cfg, C, body, strlen(body), &req, &e), TD_OK);
    td_ireq_destroy(req);
    req = NULL;
    big[512] = 'x';
    big[513] = '\0';
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],\"stop\":[\"a\",\"%s\"]}", MODEL, big);
    CHECK_STATUS(td_adapt_openai_parse(&cfg, C, body, strlen(body), &req, &e), TD_ERR_INVALID);
    CHECK(req == NULL);
    check_err("stop over 512", &e, 400, IR, "stop[1]", "string_above_max_length",
              "of 513 bytes; this server takes at most 512 bytes per stop sequence");
    small.max_stop_bytes = 8;
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"p\",\"stop\":\"123456789\"}",
             MODEL);
    CHECK_STATUS(td_adapt_openai_parse(&small, P, body, strlen(body), &req, &e), TD_ERR_INVALID);
    check_err("stop over 8", &e, 400, IR, "stop", "string_above_max_length", "at most 8 bytes");
}

static void
test_oversized_body(void)
{
    size_t n = cfg.max_body + 1;
    char *body = malloc(n);
    memset(body, ' ', n);
    memcpy(body, "{\"model\":\"x\"", 12);  /* would parse if the size were not checked */
    td_ireq_t *req = NULL;
    td_openai_err_t e;
    CHECK_STATUS(td_adapt_openai_parse(&cfg, C, body, n, &req, &e), TD_ERR_TOO_BIG);
    CHECK(req == NULL);
    check_err("oversized", &e, 413, IR, NULL, "request_too_large", "65537 bytes, the limit is 65536");
    free(body);
    /* a body exactly at the limit is parsed (and fails later, as JSON) */
    body = malloc(cfg.max_body);
    memset(body, ' ', cfg.max_body);
    CHECK_STATUS(td_adapt_openai_parse(&cfg, C, body, cfg.max_body, &req, &e), TD_ERR_INVALID);
    free(body);
}

/* ===================================================================== */
/* Good bodies                                                            */
/* ===================================================================== */

static td_ireq_t *
parse_ok(td_openai_kind_t kind, const char *tmpl)
{
    char *body = body_of(tmpl);
    td_ireq_t *req = NULL;
    td_openai_err_t e;
    td_status_t st = td_adapt_openai_parse(&cfg, kind, body, strlen(body), &req, &e);
    if (st != TD_OK)
        fprintf(stderr, "good body refused: %s: %d %s\n", body, e.http, e.message);
    CHECK_STATUS(st, TD_OK);
    free(body);
    return req;
}

static void
test_good_chat(void)
{
    td_ireq_t *r = parse_ok(C,
        "{" M ",'messages':["
        "{'role':'system','content':'be brief'},"
        "{'role':'developer','content':'dev'},"
        "{'role':'user','name':'ann','content':[{'type':'text','text':'a'},{'type':'text','text':'b'}]},"
        "{'role':'assistant','content':null,'tool_calls':[{'id':'c1','type':'function','function':{'name':'f','arguments':'{}'}}]},"
        "{'role':'tool','tool_call_id':'c1','content':'42','extra':1}],"
        "'stream':true,'stream_options':{'include_usage':true},'max_tokens':100,"
        "'temperature':0.5,'top_p':0.9,'seed':-7,'stop':['\\n\\n','END'],"
        "'presence_penalty':0.5,'frequency_penalty':-1,'n':1,'user':'u','logprobs':false,"
        "'tools':[{'type':'function','function':{'name':'f'}}],'tool_choice':'auto',"
        "'response_format':{'type':'text'},'logit_bias':{},'parallel_tool_calls':true,"
        "'priority':-3}");
    if (r == NULL)
        return;
    CHECK_EQ_INT(r->kind, C);
    CHECK_STR(r->model, MODEL);
    CHECK_EQ_INT(r->nmsgs, 5);
    CHECK_EQ_INT(r->msgs[0].role, TD_OPENAI_ROLE_SYSTEM);
    CHECK_STR(r->msgs[0].content, "be brief");
    CHECK_EQ_INT(r->msgs[1].role, TD_OPENAI_ROLE_DEVELOPER);
    CHECK_EQ_INT(r->msgs[2].role, TD_OPENAI_ROLE_USER);
    CHECK_STR(r->msgs[2].content, "a\nb");
    CHECK_STR(r->msgs[2].name, "ann");
    CHECK_EQ_INT(r->msgs[3].role, TD_OPENAI_ROLE_ASSISTANT);
    CHECK_STR(r->msgs[3].content, "");
    CHECK(r->msgs[3].tool_calls != NULL && strstr(r->msgs[3].tool_calls, "\"id\":\"c1\"") != NULL);
    CHECK_EQ_INT(r->msgs[4].role, TD_OPENAI_ROLE_TOOL);
    CHECK_STR(r->msgs[4].tool_call_id, "c1");
    CHECK_STR(r->msgs[4].content, "42");
    CHECK(r->msgs[0].name == NULL && r->msgs[0].tool_calls == NULL && r->msgs[0].tool_call_id == NULL);
    CHECK(r->out.stream && r->out.include_usage);
    CHECK_EQ_INT(r->sampling.max_tokens, 100);
    CHECK(r->sampling.temperature == 0.5 && r->sampling.top_p == 0.9);
    CHECK(r->sampling.has_seed && r->sampling.seed == -7);
    CHECK_EQ_INT(r->priority, -3);
    CHECK_EQ_INT(r->stop.nstrings, 2);
    CHECK_STR(r->stop.strings[0], "\n\n");
    CHECK_STR(r->stop.strings[1], "END");
    CHECK(r->sampling.presence_penalty == 0.5 && r->sampling.frequency_penalty == -1);
    CHECK_STR(r->tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
    CHECK_STR(r->tool_choice, "\"auto\"");
    CHECK(r->prompt == NULL);
    CHECK_STR(td_openai_role_str(r->msgs[3].role), "assistant");
    td_ireq_destroy(r);

    /* defaults; null fields are the defaults */
    r = parse_ok(C, "{" M "," MSG ",'temperature':null,'stop':null,'max_tokens':null,'seed':null}");
    if (r) {
        CHECK_EQ_INT(r->sampling.max_tokens, cfg.max_tokens_default);
        CHECK(r->sampling.temperature == 1 && r->sampling.top_p == 1 && !r->sampling.has_seed && !r->out.stream);
        CHECK_EQ_INT(r->priority, 0);
        CHECK(!r->out.include_usage && r->stop.nstrings == 0 && r->tools == NULL && r->tool_choice == NULL);
        CHECK(r->sampling.presence_penalty == 0 && r->sampling.frequency_penalty == 0);
        td_ireq_destroy(r);
    }
    /* bounds are inclusive where OpenAI's are; one stop string; max_completion_tokens */
    r = parse_ok(C, "{'model':'other-model'," MSG ",'temperature':0,'top_p':1,'max_completion_tokens':4096,'stop':'x'}");
    if (r) {
        CHECK_STR(r->model, "other-model");
        CHECK(r->sampling.temperature == 0 && r->sampling.top_p == 1);
        CHECK_EQ_INT(r->sampling.max_tokens, 4096);
        CHECK_EQ_INT(r->stop.nstrings, 1);
        CHECK_STR(r->stop.strings[0], "x");
        td_ireq_destroy(r);
    }
    r = parse_ok(C, "{" M "," MSG ",'temperature':2,'max_tokens':7,'max_completion_tokens':7,'stop':[]}");
    if (r) {
        CHECK_EQ_INT(r->sampling.max_tokens, 7);
        CHECK_EQ_INT(r->stop.nstrings, 0);
        td_ireq_destroy(r);
    }
}

/* logit_bias and logprobs as given; the vocabulary bounds the ids when the
 * server knows it */
static void
test_good_logprobs_bias(void)
{
    td_ireq_t *r = parse_ok(C, "{" M "," MSG ",'logprobs':true,'top_logprobs':20,"
                                     "'logit_bias':{'50':-100,'7':2.5,'0':100}}");
    if (r) {
        CHECK(r->out.logprobs && r->out.top_logprobs == 20);
        CHECK_EQ_INT(r->sampling.nbias, 3);
        if (r->sampling.nbias == 3)
            CHECK(r->sampling.logit_bias[0].token == 50 && r->sampling.logit_bias[0].bias == -100 &&
                  r->sampling.logit_bias[1].token == 7 && r->sampling.logit_bias[1].bias == 2.5f &&
                  r->sampling.logit_bias[2].token == 0 && r->sampling.logit_bias[2].bias == 100);
        td_ireq_destroy(r);
    }
    r = parse_ok(C, "{" M "," MSG ",'logprobs':true}");
    if (r) {
        CHECK(r->out.logprobs && r->out.top_logprobs == 0 && r->sampling.nbias == 0);
        td_ireq_destroy(r);
    }
    r = parse_ok(P, "{" M ",'prompt':'x','logprobs':0}");
    if (r) {
        CHECK(r->out.logprobs && r->out.top_logprobs == 0);
        td_ireq_destroy(r);
    }
    r = parse_ok(P, "{" M ",'prompt':'x','logprobs':5,'logit_bias':{'3':1}}");
    if (r) {
        CHECK(r->out.logprobs && r->out.top_logprobs == 5 && r->sampling.nbias == 1);
        td_ireq_destroy(r);
    }

    td_ireq_cfg_t vc = cfg;
    td_ireq_t *req = NULL;
    td_openai_err_t e;
    char *body = body_of("{" M "," MSG ",'logit_bias':{'99':1,'100':1}}");
    vc.vocab = 100;
    CHECK_STATUS(td_adapt_openai_parse(&vc, C, body, strlen(body), &req, &e), TD_ERR_INVALID);
    check_err(body, &e, 400, IR, "logit_bias", "invalid_value",
              "token id 100 is outside the vocabulary of this model (100 tokens)");
    free(body);
    body = body_of("{" M "," MSG ",'logit_bias':{'99':1}}");
    CHECK_STATUS(td_adapt_openai_parse(&vc, C, body, strlen(body), &req, &e), TD_OK);
    td_ireq_destroy(req);
    free(body);
}


/* vLLM's sampling extensions land in the request model as sent; ids are
 * checked against the vocabulary, the stop ids with the model's EOS ids
 * against the sampler's bound. */
static void
test_vllm_fields(void)
{
    static const int32_t eos[2] = { 7, 8 };
    td_ireq_cfg_t vc = cfg;
    td_ireq_t *r;
    td_openai_err_t e;
    char body[1024];

    vc.vocab = 1000;
    vc.nmodel_stop = 2;
    vc.model_stop = eos;
    vc.max_n = 4;
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"top_k\":5,\"min_p\":0.1,\"repetition_penalty\":1.3,\"min_tokens\":3,"
             "\"ignore_eos\":false,\"skip_special_tokens\":false,\"stop_token_ids\":[9,8,9],"
             "\"include_stop_str_in_output\":true,\"chat_template_kwargs\":{\"thinking\":false},"
             "\"n\":4,\"best_of\":1,\"structured_outputs\":{\"json\":null},"
             "\"response_format\":{\"type\":\"text\"},\"seed\":5}", MODEL);
    r = NULL;
    CHECK_STATUS(td_adapt_openai_parse(&vc, C, body, strlen(body), &r, &e), TD_OK);
    if (r != NULL) {
        int32_t ids[TD_IREQ_MAX_STOP_IDS];
        size_t n = td_ireq_stop_ids(r, &vc, ids);
        CHECK(r->sampling.top_k == 5 && r->sampling.min_p == 0.1 &&
              r->sampling.repetition_penalty == 1.3 && r->sampling.min_tokens == 3);
        CHECK(!r->stop.ignore_eos && !r->out.skip_special && r->stop.include_stop_str);
        CHECK(r->stop.ntoken_ids == 2 && r->stop.token_ids[0] == 9 && r->stop.token_ids[1] == 8);
        CHECK(n == 3 && ids[0] == 9 && ids[1] == 8 && ids[2] == 7);   /* EOS joined, once */
        CHECK(r->reasoning.thinking == 0 && r->n == 4);
        CHECK(r->constraint.kind == TD_IREQ_CONSTRAINT_NONE);
        r->stop.ignore_eos = true;
        CHECK_EQ_INT(td_ireq_stop_ids(r, &vc, ids), 2);
    }
    td_ireq_destroy(r);
    /* defaults: off */
    r = parse_ok(P, "{" M ",'prompt':'x','top_k':-1}");
    if (r != NULL)
        CHECK(r->sampling.top_k == 0 && r->sampling.min_p == 0 &&
              r->sampling.repetition_penalty == 1 && r->out.skip_special && r->n == 1 &&
              r->reasoning.thinking == -1 && !r->stop.include_stop_str);
    td_ireq_destroy(r);
    /* a stop id outside the vocabulary; too many with the model's */
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\",\"stop_token_ids\":[1,1000]}",
             MODEL);
    r = NULL;
    CHECK_STATUS(td_adapt_openai_parse(&vc, P, body, strlen(body), &r, &e), TD_ERR_INVALID);
    check_err(body, &e, 400, IR, "stop_token_ids[1]", "invalid_value",
              "token id 1000 is outside the vocabulary of this model (ids 0 to 999)");
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\",\"stop_token_ids\":[10,11,12,"
             "13,14,15,16,17,18,19,20,21,22,23,24,25]}", MODEL);
    CHECK_STATUS(td_adapt_openai_parse(&vc, P, body, strlen(body), &r, &e), TD_ERR_INVALID);
    check_err(body, &e, 400, IR, "stop_token_ids", "array_above_max_length",
              "with the model's 2 end-of-sequence ids they are 18 stop tokens");
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\",\"ignore_eos\":true,"
             "\"stop_token_ids\":[10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25]}", MODEL);
    CHECK_STATUS(td_adapt_openai_parse(&vc, P, body, strlen(body), &r, &e), TD_OK);
    td_ireq_destroy(r);
    /* n above the configured max-n */
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\",\"n\":5}", MODEL);
    r = NULL;
    CHECK_STATUS(td_adapt_openai_parse(&vc, P, body, strlen(body), &r, &e), TD_ERR_INVALID);
    check_err(body, &e, 400, IR, "n", "integer_above_max_value", "<= 4, but got 5");
}

static void
test_good_completion(void)
{
    td_ireq_t *r = parse_ok(P, "{" M ",'prompt':'Once upon','max_tokens':3,'echo':false,"
                                     "'best_of':1,'n':1,'logprobs':null,'suffix':'','seed':9,'stream':false}");
    if (r) {
        CHECK_EQ_INT(r->kind, P);
        CHECK_STR(r->prompt, "Once upon");
        CHECK(r->msgs == NULL && r->nmsgs == 0);
        CHECK_EQ_INT(r->sampling.max_tokens, 3);
        CHECK(r->sampling.has_seed && r->sampling.seed == 9);
        td_ireq_destroy(r);
    }
    r = parse_ok(P, "{" M ",'prompt':['only one \\u00e9']}");
    if (r) {
        CHECK_STR(r->prompt, "only one \xc3\xa9");
        td_ireq_destroy(r);
    }
}

/* A prompt given as token ids: kept as given, each checked against the
 * vocabulary when the server knows it (the error names the index and value). */
static void
test_token_prompt(void)
{
    static const struct {
        const char *body;
        size_t n;
        int32_t ids[4];
        const char *param, *substr;   /* NULL: accepted */
    } cases[] = {
        { "{" M ",'prompt':[5,0,99,7]}", 4, { 5, 0, 99, 7 }, NULL, NULL },
        { "{" M ",'prompt':[[99]],'max_tokens':2}", 1, { 99 }, NULL, NULL },
        { "{" M ",'prompt':[3,100]}", 0, {0}, "prompt[1]",
          "Invalid 'prompt[1]': token id 100 is outside the vocabulary of this model (ids 0 to 99)." },
        { "{" M ",'prompt':[[1,2,-5]]}", 0, {0}, "prompt[0][2]",
          "token id -5 is outside the vocabulary of this model (ids 0 to 99)" },
        { "{" M ",'prompt':[99999999999]}", 0, {0}, "prompt[0]", "token id 99999999999 is outside" },
    };
    td_ireq_cfg_t vc = cfg;
    vc.vocab = 100;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body = body_of(cases[i].body);
        td_ireq_t *r = NULL;
        td_openai_err_t e;
        memset(&e, 0, sizeof e);
        td_status_t st = td_adapt_openai_parse(&vc, P, body, strlen(body), &r, &e);
        if (cases[i].param) {
            CHECK_STATUS(st, TD_ERR_INVALID);
            CHECK(r == NULL);
            check_err(body, &e, 400, IR, cases[i].param, "invalid_value", cases[i].substr);
        } else {
            CHECK_STATUS(st, TD_OK);
            if (r) {
                CHECK(r->prompt == NULL);
                CHECK_EQ_INT(r->nprompt_ids, cases[i].n);
                CHECK(r->prompt_ids != NULL && memcmp(r->prompt_ids, cases[i].ids,
                                                      cases[i].n * sizeof(int32_t)) == 0);
            }
        }
        td_ireq_destroy(r);
        free(body);
    }
    /* a text prompt has no ids */
    td_ireq_t *r = parse_ok(P, "{" M ",'prompt':'abc'}");
    if (r) {
        CHECK(r->prompt_ids == NULL && r->nprompt_ids == 0);
        td_ireq_destroy(r);
    }
}

/* ===================================================================== */
/* Responses, streams, models, errors                                     */
/* ===================================================================== */

static void
check_base(json_t *o, const char *id, const char *object)
{
    CHECK_STR(json_string_value(json_object_get(o, "id")), id);
    CHECK_STR(json_string_value(json_object_get(o, "object")), object);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "created")), 1700000000);
    CHECK_STR(json_string_value(json_object_get(o, "model")), MODEL);
    CHECK_STR(json_string_value(json_object_get(o, "system_fingerprint")), "fp_tandem");
}

static void
check_usage(json_t *u, int p, int c)
{
    CHECK_EQ_INT(json_object_size(u), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), p);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), c);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), p + c);
}

static json_t *
only_choice(json_t *o, const char *finish)
{
    json_t *choices = json_object_get(o, "choices");
    CHECK_EQ_INT(json_array_size(choices), 1);
    json_t *c = json_array_get(choices, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "index")), 0);
    CHECK(json_is_null(json_object_get(c, "logprobs")));
    if (finish)
        CHECK_STR(json_string_value(json_object_get(c, "finish_reason")), finish);
    else
        CHECK(json_is_null(json_object_get(c, "finish_reason")));
    return c;
}


/* ---- One choice, as a request of one (n = 1) answers ------------------------------ */

static td_status_t
resp1(const td_openai_meta_t *m, td_openai_logprobs_t *lp, const char *text, size_t len,
      td_openai_finish_t finish, const td_openai_usage_t *u, td_buf_t *out)
{
    json_t *c = td_openai_choice_text(m->kind, 0, text, len, finish, lp);
    return td_openai_response_json(m, &c, 1, u, out);
}

static td_status_t
finish1(td_openai_stream_t *s, td_openai_logprobs_t *lp, td_openai_finish_t finish,
        const td_openai_usage_t *u, td_buf_t *out)
{
    td_status_t st;

    if (s->include_usage && u == NULL)
        return TD_ERR_INVALID;
    st = td_openai_stream_choice_end(s, 0, lp, finish, out);
    return st == TD_OK ? td_openai_stream_end(s, u, out) : st;
}

static void
test_responses(void)
{
    td_openai_meta_t m = { C, "chatcmpl-abc", 1700000000, MODEL, "fp_tandem" };
    td_openai_usage_t u = { 12, 5, 0 };
    td_buf_t out = {0};
    CHECK_STATUS(resp1(&m, NULL, "h\xc3\xa9llo \"q\"\n", 11, TD_OPENAI_FINISH_STOP, &u, &out), TD_OK);
    json_t *o = json_loads(out.data ? out.data : "", 0, NULL);
    CHECK(o != NULL);
    check_base(o, "chatcmpl-abc", "chat.completion");
    json_t *c = only_choice(o, "stop");
    json_t *msg = json_object_get(c, "message");
    CHECK_STR(json_string_value(json_object_get(msg, "role")), "assistant");
    CHECK_STR(json_string_value(json_object_get(msg, "content")), "h\xc3\xa9llo \"q\"\n");
    check_usage(json_object_get(o, "usage"), 12, 5);
    json_decref(o);

    td_buf_reset(&out);
    m = (td_openai_meta_t){ P, "cmpl-xyz", 1700000000, MODEL, "fp_tandem" };
    CHECK_STATUS(resp1(&m, NULL, "abc", 3, TD_OPENAI_FINISH_LENGTH, &u, &out), TD_OK);
    o = json_loads(out.data ? out.data : "", 0, NULL);
    check_base(o, "cmpl-xyz", "text_completion");
    c = only_choice(o, "length");
    CHECK_STR(json_string_value(json_object_get(c, "text")), "abc");
    CHECK(json_object_get(c, "message") == NULL);
    check_usage(json_object_get(o, "usage"), 12, 5);
    /* nothing served from a prefix cache: no prompt_tokens_details */
    CHECK(json_object_get(json_object_get(o, "usage"), "prompt_tokens_details") == NULL);
    json_decref(o);

    /* served from a prefix cache: usage.prompt_tokens_details.cached_tokens */
    td_buf_reset(&out);
    td_openai_usage_t uc = { 12, 5, 8 };
    CHECK_STATUS(resp1(&m, NULL, "abc", 3, TD_OPENAI_FINISH_STOP, &uc, &out), TD_OK);
    o = json_loads(out.data ? out.data : "", 0, NULL);
    CHECK(o != NULL);
    json_t *uo = json_object_get(o, "usage");
    CHECK_EQ_INT(json_object_size(uo), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(uo, "prompt_tokens")), 12);
    CHECK_EQ_INT(json_integer_value(json_object_get(uo, "total_tokens")), 17);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(uo, "prompt_tokens_details"),
                                                    "cached_tokens")), 8);
    json_decref(o);

    /* invalid UTF-8 text is refused, not emitted as broken JSON */
    td_buf_reset(&out);
    CHECK_STATUS(resp1(&m, NULL, "\xff", 1, TD_OPENAI_FINISH_STOP, &u, &out), TD_ERR_INVALID);
    CHECK_EQ_INT(out.len, 0);

    /* no fingerprint: JSON null */
    m.fingerprint = NULL;
    CHECK_STATUS(resp1(&m, NULL, "", 0, TD_OPENAI_FINISH_STOP, &u, &out), TD_OK);
    o = json_loads(out.data ? out.data : "", 0, NULL);
    CHECK(json_is_null(json_object_get(o, "system_fingerprint")));
    json_decref(o);
    td_buf_free(&out);
}

/* Split an SSE stream into the payloads of its `data:` events. */
static size_t
sse_payloads(const char *s, char **payloads, size_t max)
{
    size_t n = 0;
    while (*s && n < max) {
        const char *end = strstr(s, "\n\n");
        CHECK(end != NULL);
        CHECK(strncmp(s, "data: ", 6) == 0);
        if (end == NULL || strncmp(s, "data: ", 6) != 0)
            break;
        payloads[n++] = strndup(s + 6, (size_t)(end - s - 6));
        s = end + 2;
    }
    return n;
}

static void
free_payloads(char **p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(p[i]);
}

static void
test_chat_stream(bool include_usage)
{
    td_openai_stream_t s = { { C, "chatcmpl-s", 1700000000, MODEL, "fp_tandem" }, include_usage, 0 };
    td_openai_usage_t u = { 4, 2, 0 };
    td_buf_t out = {0};
    CHECK_STATUS(td_openai_stream_text(&s, 0, NULL, "Hel", 3, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_text(&s, 0, NULL, "lo", 2, &out), TD_OK);
    CHECK_STATUS(finish1(&s, NULL, TD_OPENAI_FINISH_LENGTH, &u, &out), TD_OK);
    char *p[8];
    size_t n = sse_payloads(out.data, p, 8);
    CHECK_EQ_INT(n, include_usage ? 5 : 4);
    if (n == (include_usage ? 5u : 4u)) {
        const char *want_content[] = { "Hel", "lo", NULL };
        for (size_t i = 0; i < 3; i++) {
            json_t *o = json_loads(p[i], 0, NULL);
            CHECK(o != NULL);
            check_base(o, "chatcmpl-s", "chat.completion.chunk");
            json_t *c = only_choice(o, i == 2 ? "length" : NULL);
            json_t *d = json_object_get(c, "delta");
            CHECK(json_is_object(d));
            if (i == 0)
                CHECK_STR(json_string_value(json_object_get(d, "role")), "assistant");
            else
                CHECK(json_object_get(d, "role") == NULL);
            if (want_content[i])
                CHECK_STR(json_string_value(json_object_get(d, "content")), want_content[i]);
            else
                CHECK_EQ_INT(json_object_size(d), 0);
            if (include_usage)
                CHECK(json_is_null(json_object_get(o, "usage")));
            else
                CHECK(json_object_get(o, "usage") == NULL);
            json_decref(o);
        }
        if (include_usage) {
            json_t *o = json_loads(p[3], 0, NULL);
            check_base(o, "chatcmpl-s", "chat.completion.chunk");
            CHECK(json_is_array(json_object_get(o, "choices")));
            CHECK_EQ_INT(json_array_size(json_object_get(o, "choices")), 0);
            check_usage(json_object_get(o, "usage"), 4, 2);
            json_decref(o);
        }
        CHECK_STR(p[n - 1], "[DONE]");
    }
    free_payloads(p, n);
    td_buf_free(&out);
}

static void
test_streams(void)
{
    test_chat_stream(false);
    test_chat_stream(true);

    /* a chat stream that ends at once still names the role; usage required */
    td_openai_stream_t s = { { C, "chatcmpl-e", 1700000000, MODEL, NULL }, true, 0 };
    td_buf_t out = {0};
    CHECK_STATUS(finish1(&s, NULL, TD_OPENAI_FINISH_STOP, NULL, &out), TD_ERR_INVALID);
    CHECK_EQ_INT(out.len, 0);
    td_openai_usage_t u = { 1, 0, 0 };
    CHECK_STATUS(finish1(&s, NULL, TD_OPENAI_FINISH_STOP, &u, &out), TD_OK);
    char *p[8];
    size_t n = sse_payloads(out.data, p, 8);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        json_t *o = json_loads(p[0], 0, NULL);
        json_t *d = json_object_get(only_choice(o, "stop"), "delta");
        CHECK_STR(json_string_value(json_object_get(d, "role")), "assistant");
        json_decref(o);
        CHECK_STR(p[2], "[DONE]");
    }
    free_payloads(p, n);
    td_buf_reset(&out);

    /* completions: text chunks, no role, a final chunk with text "" */
    td_openai_stream_t cs = { { P, "cmpl-s", 1700000000, MODEL, "fp_tandem" }, false, 0 };
    CHECK_STATUS(td_openai_stream_text(&cs, 0, NULL, "ab", 2, &out), TD_OK);
    CHECK_STATUS(finish1(&cs, NULL, TD_OPENAI_FINISH_STOP, NULL, &out), TD_OK);
    n = sse_payloads(out.data, p, 8);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        for (size_t i = 0; i < 2; i++) {
            json_t *o = json_loads(p[i], 0, NULL);
            check_base(o, "cmpl-s", "text_completion");
            json_t *c = only_choice(o, i == 1 ? "stop" : NULL);
            CHECK_STR(json_string_value(json_object_get(c, "text")), i == 0 ? "ab" : "");
            CHECK(json_object_get(c, "delta") == NULL);
            json_decref(o);
        }
        CHECK_STR(p[2], "[DONE]");
    }
    free_payloads(p, n);
    td_buf_reset(&out);

    /* an error in the middle of a stream */
    td_openai_err_t e;
    td_openai_err_internal(&e, "decode rank lost");
    CHECK_STATUS(td_openai_stream_error(&e, &out), TD_OK);
    n = sse_payloads(out.data, p, 8);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        json_t *o = json_loads(p[0], 0, NULL);
        json_t *err = json_object_get(o, "error");
        CHECK_STR(json_string_value(json_object_get(err, "type")), "server_error");
        CHECK(strstr(json_string_value(json_object_get(err, "message")), "decode rank lost") != NULL);
        json_decref(o);
        CHECK_STR(p[1], "[DONE]");
    }
    free_payloads(p, n);
    td_buf_free(&out);
}

/* logprobs in OpenAI's shapes: chat entries with bytes and alternatives,
 * completions' parallel lists; a stream's chunk carries the entries that
 * came since the last one; -inf is -9999.0, bytes that are not UTF-8 U+FFFD */
/* got equals want (a new reference, dropped here). */
static int
json_eq_new(const json_t *got, json_t *want)
{
    int eq = want != NULL && json_equal(got, want);
    json_decref(want);
    return eq;
}

static void
test_logprobs_json(void)
{
    td_openai_logprobs_t *lp = NULL;
    td_openai_token_lp_t t1 = { "Hi", 2, -0.5 }, t2 = { "\xe4\xbd", 2, -INFINITY };
    td_openai_token_lp_t alts[2] = { { "Hi", 2, -0.5 }, { " a", 2, -1.25 } };
    td_openai_usage_t u = { 3, 2, 0 };
    td_buf_t out = {0};

    CHECK_STATUS(td_openai_logprobs_create(C, &lp), TD_OK);
    if (lp == NULL)
        return;
    td_openai_meta_t m = { C, "chatcmpl-l", 1700000000, MODEL, "fp_tandem" };
    CHECK_STATUS(td_openai_logprobs_add(lp, &t1, alts, 2), TD_OK);
    CHECK_STATUS(td_openai_logprobs_add(lp, &t2, NULL, 0), TD_OK);
    CHECK_STATUS(resp1(&m, lp, "Hi\xef\xbf\xbd", 5, TD_OPENAI_FINISH_STOP, &u,
                                         &out), TD_OK);
    json_t *o = json_loads(out.data ? out.data : "", 0, NULL);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    json_t *l = json_object_get(c, "logprobs");
    json_t *content = json_object_get(l, "content");
    CHECK(json_is_null(json_object_get(l, "refusal")));
    CHECK_EQ_INT(json_array_size(content), 2);
    json_t *e0 = json_array_get(content, 0), *e1 = json_array_get(content, 1);
    CHECK_STR(json_string_value(json_object_get(e0, "token")), "Hi");
    CHECK(json_real_value(json_object_get(e0, "logprob")) == -0.5);
    CHECK(json_eq_new(json_object_get(e0, "bytes"), json_pack("[i,i]", 'H', 'i')));
    json_t *top = json_object_get(e0, "top_logprobs");
    CHECK_EQ_INT(json_array_size(top), 2);
    CHECK_STR(json_string_value(json_object_get(json_array_get(top, 1), "token")), " a");
    CHECK(json_real_value(json_object_get(json_array_get(top, 1), "logprob")) == -1.25);
    CHECK(json_object_get(json_array_get(top, 1), "top_logprobs") == NULL);
    CHECK_STR(json_string_value(json_object_get(e1, "token")), "\xef\xbf\xbd");
    CHECK(json_real_value(json_object_get(e1, "logprob")) == -9999.0);
    CHECK(json_eq_new(json_object_get(e1, "bytes"), json_pack("[i,i]", 0xe4, 0xbd)));
    CHECK_EQ_INT(json_array_size(json_object_get(e1, "top_logprobs")), 0);
    json_decref(o);
    td_buf_reset(&out);

    /* a stream: each chunk takes what came since the last one, none: null */
    td_openai_stream_t s = { m, false, 0 };
    CHECK_STATUS(td_openai_logprobs_add(lp, &t1, NULL, 0), TD_OK);
    CHECK_STATUS(td_openai_stream_text(&s, 0, lp, "Hi", 2, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_text(&s, 0, lp, "", 0, &out), TD_OK);
    CHECK_STATUS(td_openai_logprobs_add(lp, &t1, NULL, 0), TD_OK);
    CHECK_STATUS(td_openai_logprobs_add(lp, &t1, NULL, 0), TD_OK);
    CHECK_STATUS(finish1(&s, lp, TD_OPENAI_FINISH_STOP, NULL, &out), TD_OK);
    char *p[8];
    size_t n = sse_payloads(out.data, p, 8);
    static const int want[3] = { 1, -1, 2 };   /* entries per chunk; -1: null */
    CHECK_EQ_INT(n, 4);
    for (size_t i = 0; i < 3 && n == 4; i++) {
        json_t *co = json_loads(p[i], 0, NULL);
        json_t *cl = json_object_get(json_array_get(json_object_get(co, "choices"), 0),
                                     "logprobs");
        if (want[i] < 0)
            CHECK(json_is_null(cl));
        else
            CHECK_EQ_INT(json_array_size(json_object_get(cl, "content")), want[i]);
        json_decref(co);
    }
    free_payloads(p, n);
    td_buf_reset(&out);
    td_openai_logprobs_destroy(lp);

    /* completions: tokens, token_logprobs, top_logprobs (a dict), text_offset */
    CHECK_STATUS(td_openai_logprobs_create(P, &lp), TD_OK);
    if (lp == NULL)
        return;
    m = (td_openai_meta_t){ P, "cmpl-l", 1700000000, MODEL, "fp_tandem" };
    td_openai_token_lp_t w1 = { "h\xc3\xa9", 3, -0.25 }, w2 = { "!", 1, -2 };
    CHECK_STATUS(td_openai_logprobs_add(lp, &w1, alts, 2), TD_OK);
    CHECK_STATUS(td_openai_logprobs_add(lp, &w2, alts, 1), TD_OK);
    CHECK_STATUS(resp1(&m, lp, "h\xc3\xa9!", 4, TD_OPENAI_FINISH_LENGTH, &u, &out),
                 TD_OK);
    o = json_loads(out.data ? out.data : "", 0, NULL);
    l = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    CHECK(json_eq_new(json_object_get(l, "tokens"), json_pack("[s,s]", "h\xc3\xa9", "!")));
    CHECK(json_eq_new(json_object_get(l, "token_logprobs"), json_pack("[f,f]", -0.25, -2.0)));
    CHECK(json_eq_new(json_object_get(l, "text_offset"), json_pack("[i,i]", 0, 2)));
    CHECK(json_eq_new(json_object_get(l, "top_logprobs"),
                      json_pack("[{s:f,s:f},{s:f}]", "Hi", -0.5, " a", -1.25, "Hi", -0.5)));
    json_decref(o);
    td_buf_free(&out);
    td_openai_logprobs_destroy(lp);
}

static void
test_models_and_errors(void)
{
    td_openai_model_t ms[] = {
        { MODEL, 1700000000, "synthetic (deterministic stand-in, not the model)", TD_TOK_BYTES_NAME },
    };
    td_buf_t out = {0};
    CHECK_STATUS(td_openai_models_json(ms, 1, &out), TD_OK);
    json_t *o = json_loads(out.data ? out.data : "", 0, NULL);
    CHECK_STR(json_string_value(json_object_get(o, "object")), "list");
    json_t *data = json_object_get(o, "data");
    CHECK_EQ_INT(json_array_size(data), 1);
    json_t *m = json_array_get(data, 0);
    CHECK_STR(json_string_value(json_object_get(m, "id")), MODEL);
    CHECK_STR(json_string_value(json_object_get(m, "object")), "model");
    CHECK_EQ_INT(json_integer_value(json_object_get(m, "created")), 1700000000);
    CHECK_STR(json_string_value(json_object_get(m, "owned_by")), "tandem");
    CHECK(strstr(json_string_value(json_object_get(m, "engine")), "synthetic") != NULL);
    CHECK_STR(json_string_value(json_object_get(m, "tokenizer")),
              "byte-level (stand-in until the V4.1 tokenizer lands)");
    json_decref(o);
    td_buf_reset(&out);
    CHECK_STATUS(td_openai_models_json(NULL, 0, &out), TD_OK);
    CHECK_STR(out.data, "{\"object\":\"list\",\"data\":[]}");
    td_buf_free(&out);

    td_openai_err_t e;
    td_openai_err_auth(&e, true);
    check_err("auth bad key", &e, 401, IR, NULL, "invalid_api_key", "Incorrect API key provided");
    td_openai_err_auth(&e, false);
    check_err("auth no key", &e, 401, IR, NULL, NULL, "You didn't provide an API key");
    td_openai_err_overloaded(&e, 2);
    check_err("overloaded", &e, 503, "server_error", NULL, NULL, "overloaded");
    CHECK_EQ_INT(e.retry_after, 2);
    td_openai_err_internal(&e, "boom");
    check_err("internal", &e, 500, "server_error", NULL, NULL, "boom");
    CHECK_EQ_INT(e.retry_after, 0);
    td_openai_err_no_route(&e, "GET", "/v2/x");
    check_err("no route", &e, 404, IR, NULL, NULL, "Invalid URL (GET /v2/x)");

    /* a long message is cut at a character boundary: still valid JSON */
    char big[700];
    for (size_t i = 0; i + 2 < sizeof big; i += 2)
        memcpy(big + i, "\xc3\xa9", 2);
    big[sizeof big - 1] = '\0';
    for (int shift = 0; shift < 3; shift++) {
        td_openai_err_set(&e, 400, IR, NULL, NULL, "%.*s%s", shift, "xx", big);
        check_err("long", &e, 400, IR, NULL, NULL, "\xc3\xa9");
    }

    /* bytes that are not UTF-8 become '?', in the message and the param */
    td_openai_err_set(&e, 400, IR, "messages[0].\xc3", NULL, "bad \xff byte, cut \xe2\x82");
    check_err("not utf-8", &e, 400, IR, "messages[0].?", NULL, "bad ? byte, cut ??");
    td_openai_err_set(&e, 400, IR, NULL, NULL, "%s", "surrogate \xed\xa0\x80, overlong \xc0\xaf, ok \xf0\x9f\x98\x80");
    check_err("not utf-8", &e, 400, IR, NULL, NULL, "surrogate ???, overlong ??, ok \xf0\x9f\x98\x80");

    char id1[TD_OPENAI_ID_LEN], id2[TD_OPENAI_ID_LEN];
    CHECK_STATUS(td_openai_id_new(C, id1), TD_OK);
    CHECK_STATUS(td_openai_id_new(P, id2), TD_OK);
    CHECK(strncmp(id1, "chatcmpl-", 9) == 0 && strlen(id1) == 9 + 24);
    CHECK(strncmp(id2, "cmpl-", 5) == 0 && strlen(id2) == 5 + 24);
}

static void
test_sse(void)
{
    static const struct { const char *data, *want; } cases[] = {
        { "{\"a\":1}", "data: {\"a\":1}\n\n" },
        { "", "data: \n\n" },
        { "a\nb", "data: a\ndata: b\n\n" },
        { "a\r\nb\rc\n", "data: a\ndata: b\ndata: c\ndata: \n\n" },
    };
    td_buf_t out = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_buf_reset(&out);
        CHECK_STATUS(td_sse_event(&out, cases[i].data, strlen(cases[i].data)), TD_OK);
        CHECK_STR(out.data, cases[i].want);
    }
    td_buf_reset(&out);
    CHECK_STATUS(td_sse_comment(&out, "keep-alive"), TD_OK);
    CHECK_STATUS(td_sse_comment(&out, "two\nlines"), TD_ERR_INVALID);
    CHECK_STATUS(td_sse_done(&out), TD_OK);
    CHECK_STR(out.data, ": keep-alive\n\ndata: [DONE]\n\n");
    td_buf_free(&out);
}


/* ===================================================================== */
/* Several choices; the reply reader                                       */
/* ===================================================================== */

/* n = 2: a response with choices 0 and 1; a stream whose chunks each carry
 * one choice with its index, role once per choice, a finish chunk each. */
static void
test_choices_json(void)
{
    td_openai_meta_t m = { C, "chatcmpl-n", 1700000000, MODEL, "fp_tandem" };
    td_openai_usage_t u = { 3, 7, 0 };
    td_buf_t out = {0};
    json_t *ch[2] = { td_openai_choice_text(C, 0, "a", 1, TD_OPENAI_FINISH_STOP, NULL),
                      td_openai_choice_text(C, 1, "bc", 2, TD_OPENAI_FINISH_LENGTH, NULL) };

    CHECK_STATUS(td_openai_response_json(&m, ch, 2, &u, &out), TD_OK);
    json_t *o = json_loads(out.data ? out.data : "", 0, NULL);
    json_t *cs = json_object_get(o, "choices");
    CHECK_EQ_INT(json_array_size(cs), 2);
    for (int i = 0; i < 2 && json_array_size(cs) == 2; i++) {
        json_t *c = json_array_get(cs, i);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "index")), i);
        CHECK_STR(json_string_value(json_object_get(json_object_get(c, "message"), "content")),
                  i == 0 ? "a" : "bc");
        CHECK_STR(json_string_value(json_object_get(c, "finish_reason")),
                  i == 0 ? "stop" : "length");
    }
    json_decref(o);
    td_buf_reset(&out);

    td_openai_stream_t s = { m, false, 0 };
    CHECK_STATUS(td_openai_stream_text(&s, 1, NULL, "x", 1, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_text(&s, 0, NULL, "y", 1, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_text(&s, 1, NULL, "z", 1, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_choice_end(&s, 1, NULL, TD_OPENAI_FINISH_STOP, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_choice_end(&s, 0, NULL, TD_OPENAI_FINISH_LENGTH, &out), TD_OK);
    CHECK_STATUS(td_openai_stream_end(&s, NULL, &out), TD_OK);
    char *p[8];
    size_t n = sse_payloads(out.data, p, 8);
    static const int want_index[5] = { 1, 0, 1, 1, 0 };
    static const int want_role[5] = { 1, 1, 0, 0, 0 };
    CHECK_EQ_INT(n, 6);
    for (size_t i = 0; i < 5 && n == 6; i++) {
        json_t *co = json_loads(p[i], 0, NULL);
        json_t *c = json_array_get(json_object_get(co, "choices"), 0);
        json_t *d = json_object_get(c, "delta");
        CHECK_EQ_INT(json_array_size(json_object_get(co, "choices")), 1);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "index")), want_index[i]);
        CHECK((json_object_get(d, "role") != NULL) == want_role[i]);
        json_decref(co);
    }
    if (n == 6)
        CHECK_STR(p[5], "[DONE]");
    free_payloads(p, n);
    td_buf_free(&out);
}

static td_status_t
reply_collect(void *arg, td_reply_t *rp, const td_chat_reply_delta_t *d)
{
    return td_buf_append(arg, d->text, d->len);
}

/* Feed text as byte tokens (one token per byte) to a reply reader in
 * messages of `per` tokens; last_stop on the last; returns its text. */
static char *
reply_run(const td_ireq_t *r, const td_tok_t *tok, const char *text, size_t per,
          bool last_stop, uint32_t *ntokens, bool *stopped)
{
    td_reply_cfg_t rc = { .tok = tok, .req = r };
    td_reply_t *rp = NULL;
    td_buf_t out = {0};
    size_t len = strlen(text);
    char *res;

    *stopped = false;
    CHECK_STATUS(td_reply_create(&rc, &rp), TD_OK);
    if (rp == NULL)
        return strdup("");
    for (size_t at = 0; at < len && !*stopped; at += per) {
        uint32_t ids[64];
        size_t k = len - at < per ? len - at : per;
        for (size_t i = 0; i < k; i++)
            ids[i] = (unsigned char)text[at + i];
        CHECK_STATUS(td_reply_feed(rp, ids, k, last_stop && at + k == len, NULL, reply_collect,
                                   &out, stopped), TD_OK);
    }
    CHECK_STATUS(td_reply_end(rp, *stopped ? TD_OPENAI_FINISH_STOP : TD_OPENAI_FINISH_LENGTH,
                              reply_collect, &out), TD_OK);
    *ntokens = td_reply_ntokens(rp);
    td_reply_destroy(rp);
    res = strdup(out.data ? out.data : "");
    td_buf_free(&out);
    return res;
}

/* The reply reader: a stop string is armed only past min_tokens tokens,
 * kept with include_stop_str_in_output; a stop token's text is left out
 * unless included; every token counts. */
static void
test_reply_reader(void)
{
    td_tok_t *tok = NULL;
    td_ireq_t *r = parse_ok(P, "{" M ",'prompt':'x','stop':['END']}");
    uint32_t nt;
    bool stopped;
    char *got;

    CHECK_STATUS(td_tok_bytes_create(&tok), TD_OK);
    if (tok == NULL || r == NULL)
        return;
    got = reply_run(r, tok, "aENDbENDc", 4, false, &nt, &stopped);
    CHECK_STR(got, "a");
    CHECK(stopped && nt == 4);   /* the message's tokens count */
    free(got);
    r->sampling.min_tokens = 4;   /* the first END ends at token 4: not past 4 */
    for (size_t per = 1; per <= 9; per += 4) {
        got = reply_run(r, tok, "aENDbENDc", per, false, &nt, &stopped);
        CHECK_STR(got, "aENDb");
        CHECK(stopped);
        free(got);
    }
    r->stop.include_stop_str = true;
    got = reply_run(r, tok, "aENDbENDc", 9, false, &nt, &stopped);
    CHECK_STR(got, "aENDbEND");
    free(got);
    r->stop.include_stop_str = false;
    r->sampling.min_tokens = 0;
    r->stop.nstrings = 0;   /* (the strings stay the request's to free) */
    got = reply_run(r, tok, "hello!", 3, true, &nt, &stopped);
    CHECK_STR(got, "hello");   /* "!" is the stop token */
    CHECK_EQ_INT(nt, 6);
    free(got);
    r->stop.include_stop_str = true;
    got = reply_run(r, tok, "hello!", 3, true, &nt, &stopped);
    CHECK_STR(got, "hello!");
    free(got);
    r->stop.nstrings = 1;
    td_ireq_destroy(r);
    td_tok_destroy(tok);
}

/* Messages' thinking.budget_tokens: a reasoning that reaches the budget
 * ends the choice there (finish LENGTH, not a stop string); one that ends
 * first does not count against it. */
static void
test_reply_budget(void)
{
    static const struct { uint32_t budget; const char *out, *reasoning, *content; bool over; }
    cases[] = {
        { 5, "abcdefghij</think>answer", "abcde", "", true },
        { 20, "abc</think>answer is long enough", "abc", "answer is long enough", false },
        { 0, "abcdefghij</think>ok", "abcdefghij", "ok", false },
    };
    td_tok_t *tok = NULL;
    td_ireq_t *r = parse_ok(C, "{" M ",'messages':[{'role':'user','content':'x'}]}");
    td_chat_reply_opts_t co = { .start = TD_CHAT_REPLY_START_REASONING, .tool_calls = true };

    CHECK_STATUS(td_tok_bytes_create(&tok), TD_OK);
    for (size_t c = 0; tok && r && c < sizeof cases / sizeof cases[0]; c++) {
        td_reply_cfg_t rc = { .tok = tok, .req = r, .chat = &co };
        td_reply_t *rp = NULL;
        bool stopped = false;
        size_t len = strlen(cases[c].out), i;

        r->reasoning.budget = cases[c].budget;
        CHECK_STATUS(td_reply_create(&rc, &rp), TD_OK);
        if (rp == NULL)
            break;
        for (i = 0; i < len && !stopped; i++) {
            uint32_t id = (unsigned char)cases[c].out[i];
            CHECK_STATUS(td_reply_feed(rp, &id, 1, false, NULL, NULL, NULL, &stopped), TD_OK);
        }
        CHECK(stopped == cases[c].over && td_reply_over_budget(rp) == cases[c].over);
        CHECK_STATUS(td_reply_end(rp, stopped ? TD_OPENAI_FINISH_STOP : TD_OPENAI_FINISH_STOP,
                                  NULL, NULL), TD_OK);
        CHECK_EQ_INT(td_reply_finish_reason(rp), cases[c].over ? TD_OPENAI_FINISH_LENGTH
                                                               : TD_OPENAI_FINISH_STOP);
        const td_chat_reply_t *cr = td_reply_chat(rp);
        CHECK_STR(cr->reasoning, cases[c].reasoning);
        CHECK_STR(cr->content, cases[c].content);
        if (cases[c].over)
            CHECK_EQ_INT(td_reply_ntokens(rp), cases[c].budget);
        td_reply_destroy(rp);
    }
    td_ireq_destroy(r);
    td_tok_destroy(tok);
}

/* ===================================================================== */
/* Byte-level tokenizer                                                   */
/* ===================================================================== */

static bool
valid_utf8(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    json_decref(j);
    return j != NULL;
}

static td_rng_t rng = { .state = 7 };

/* Decode ids in pieces of random sizes; flush at the end. */
static void
decode_pieces(const td_tok_t *tok, const uint32_t *ids, size_t n, td_buf_t *out)
{
    td_tok_dec_t st = {0};
    for (size_t i = 0; i < n;) {
        size_t k = 1 + (size_t)(td_rng_next(&rng) % 5);
        if (k > n - i)
            k = n - i;
        CHECK_STATUS(td_tok_decode(tok, &st, ids + i, k, true, out), TD_OK);
        i += k;
    }
    CHECK_STATUS(td_tok_decode_flush(&st, out), TD_OK);
}

static void
test_tok_bytes(void)
{
    td_tok_t *tok = NULL;
    CHECK_STATUS(td_tok_bytes_create(&tok), TD_OK);
    if (tok == NULL)
        return;
    CHECK_STR(tok->name, "byte-level (stand-in until the V4.1 tokenizer lands)");
    CHECK_EQ_INT(tok->vocab_size, 256);

    /* valid UTF-8 round-trips exactly, whatever the pieces */
    const char *text = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87!";
    uint32_t *ids;
    size_t n;
    CHECK_STATUS(td_tok_encode(tok, text, strlen(text), &ids, &n), TD_OK);
    CHECK_EQ_INT(n, strlen(text));
    CHECK_EQ_INT(ids[1], 0xc3);
    for (int round = 0; round < 50; round++) {
        td_buf_t out = {0};
        decode_pieces(tok, ids, n, &out);
        CHECK_STR(out.data, text);
        td_buf_free(&out);
    }
    free(ids);

    /* a character split across calls appears only once complete */
    td_tok_dec_t st = {0};
    td_buf_t out = {0};
    const uint32_t emoji[] = { 0xf0, 0x9f, 0x98, 0x80 };
    for (size_t i = 0; i < 3; i++) {
        CHECK_STATUS(td_tok_decode(tok, &st, &emoji[i], 1, true, &out), TD_OK);
        CHECK_EQ_INT(out.len, 0);
    }
    CHECK_STATUS(td_tok_decode(tok, &st, &emoji[3], 1, true, &out), TD_OK);
    CHECK_STR(out.data, "\xf0\x9f\x98\x80");

    /* invalid sequences become U+FFFD; a dangling lead byte at the end too */
    static const struct { uint32_t ids[6]; size_t n; const char *want; } invalid[] = {
        { { 0xff }, 1, "\xef\xbf\xbd" },
        { { 0xc3, 0x41 }, 2, "\xef\xbf\xbd" "A" },
        { { 0x80, 0x41 }, 2, "\xef\xbf\xbd" "A" },
        { { 0xc0, 0xaf }, 2, "\xef\xbf\xbd\xef\xbf\xbd" },          /* overlong */
        { { 0xed, 0xa0, 0x80 }, 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" }, /* surrogate */
        { { 0xe2, 0x82 }, 2, "\xef\xbf\xbd" },                      /* cut off at the end */
        { { 0xe2, 0x82, 0xe2, 0x82, 0xac }, 5, "\xef\xbf\xbd\xe2\x82\xac" },
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        td_buf_reset(&out);
        td_tok_dec_t s2 = {0};
        CHECK_STATUS(td_tok_decode(tok, &s2, invalid[i].ids, invalid[i].n, true, &out), TD_OK);
        CHECK_STATUS(td_tok_decode_flush(&s2, &out), TD_OK);
        CHECK_STR(out.data, invalid[i].want);
    }

    /* random bytes: any cut decodes to the same valid UTF-8; valid input is unchanged */
    for (int round = 0; round < 200; round++) {
        char raw[64];
        size_t len = (size_t)(td_rng_next(&rng) % sizeof raw);
        for (size_t i = 0; i < len; i++) {
            uint64_t r = td_rng_next(&rng);
            raw[i] = (char)(round % 2 ? r : 0xc0 + r % 0x40 - ((r >> 32) % 2) * 0x40);
        }
        CHECK_STATUS(td_tok_encode(tok, raw, len, &ids, &n), TD_OK);
        td_buf_t whole = {0}, cut = {0};
        td_tok_dec_t s3 = {0};
        CHECK_STATUS(td_tok_decode(tok, &s3, ids, n, true, &whole), TD_OK);
        CHECK_STATUS(td_tok_decode_flush(&s3, &whole), TD_OK);
        decode_pieces(tok, ids, n, &cut);
        CHECK(whole.len == cut.len && (whole.len == 0 || memcmp(whole.data, cut.data, whole.len) == 0));
        CHECK(whole.len == 0 || valid_utf8(whole.data, whole.len));
        if (valid_utf8(raw, len))
            CHECK(whole.len == len && (len == 0 || memcmp(whole.data, raw, len) == 0));
        td_buf_free(&whole);
        td_buf_free(&cut);
        free(ids);
    }

    /* an id outside the vocabulary is an error, not a crash */
    td_buf_reset(&out);
    td_tok_dec_t s4 = {0};
    const uint32_t oob[] = { 'a', 300, 'b' };
    CHECK_STATUS(td_tok_decode(tok, &s4, oob, 3, true, &out), TD_ERR_RANGE);
    CHECK_STR(out.data, "a");
    CHECK_STATUS(td_tok_encode(tok, "", 0, &ids, &n), TD_OK);
    CHECK_EQ_INT(n, 0);
    free(ids);
    td_buf_free(&out);
    td_tok_destroy(tok);
}

/* ===================================================================== */
/* API keys                                                               */
/* ===================================================================== */

static char *
write_tmp(const char *content)
{
    char *path = strdup("/tmp/td_apikeys_XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    size_t len = strlen(content);
    CHECK(write(fd, content, len) == (ssize_t)len);
    close(fd);
    return path;
}

static void
rewrite(const char *path, const char *content)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
}

/* apikeys.c reports each failure once, in the log: the error lines since
 * the last check, the last one kept. */
static char last_error[1024];
static int nerrors;

static void
err_sink(td_log_level_t level, const char *line, void *arg)
{
    if (level == TD_LOG_ERROR) {
        snprintf(last_error, sizeof last_error, "%s", line);
        nerrors++;
    }
}

/* Exactly one error line since the last call, and it says what (and, when
 * given, which file). */
static void
check_one_error(const char *path, const char *what)
{
    CHECK_EQ_INT(nerrors, 1);
    CHECK(path == NULL || strstr(last_error, path) != NULL);
    CHECK(strstr(last_error, what) != NULL);
    if (nerrors != 1 || strstr(last_error, what) == NULL)
        fprintf(stderr, "  wanted \"%s\", got %d error line(s), last \"%s\"\n", what, nerrors,
                last_error);
    nerrors = 0;
    last_error[0] = '\0';
}

static void
test_apikeys(void)
{
    td_log_set_sink(err_sink, NULL);
    char *path = write_tmp("# client keys\n\n  sk-one  \r\nsk-two\r\n   # indented comment\n\t\nsk-three");
    td_apikeys_t *k = NULL;
    CHECK_STATUS(td_apikeys_load(path, &k), TD_OK);
    if (k == NULL)
        return;
    CHECK_EQ_INT(td_apikeys_count(k), 3);
    CHECK(td_apikeys_match(k, "sk-one", 6));
    CHECK(td_apikeys_match(k, "sk-two", 6));
    CHECK(td_apikeys_match(k, "sk-three", 8));
    CHECK(!td_apikeys_match(k, "sk-on", 5));
    CHECK(!td_apikeys_match(k, "sk-one ", 7));
    CHECK(!td_apikeys_match(k, "# client keys", 13));
    CHECK(!td_apikeys_match(k, "", 0));

    static const struct { const char *hdr; td_status_t st; } hdrs[] = {
        { "Bearer sk-one", TD_OK },
        { "bearer   sk-two  ", TD_OK },
        { "BEARER sk-three", TD_OK },
        { "Bearer sk-four", TD_ERR_AUTH },
        { "Bearer SK-ONE", TD_ERR_AUTH },
        { "Bearer", TD_ERR_NOT_FOUND },
        { "Bearer   ", TD_ERR_NOT_FOUND },
        { "Basic c2stb25l", TD_ERR_NOT_FOUND },
        { "Bearersk-one", TD_ERR_NOT_FOUND },
        { "", TD_ERR_NOT_FOUND },
        { NULL, TD_ERR_NOT_FOUND },
    };
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++)
        CHECK_STATUS(td_apikeys_check_header(k, hdrs[i].hdr), hdrs[i].st);

    /* reload picks up the new file; a broken file keeps the old keys */
    rewrite(path, "sk-new\n");
    CHECK_STATUS(td_apikeys_reload(k), TD_OK);
    CHECK_EQ_INT(td_apikeys_count(k), 1);
    CHECK(td_apikeys_match(k, "sk-new", 6));
    CHECK(!td_apikeys_match(k, "sk-one", 6));
    rewrite(path, "sk-a\nsk b\n");
    CHECK_STATUS(td_apikeys_reload(k), TD_ERR_INVALID);
    check_one_error(path, ":2: key contains whitespace");
    CHECK(td_apikeys_match(k, "sk-new", 6));
    CHECK(!td_apikeys_match(k, "sk-a", 4));
    unlink(path);
    CHECK_STATUS(td_apikeys_reload(k), TD_ERR_NOT_FOUND);
    check_one_error(path, "No such file");
    CHECK(td_apikeys_match(k, "sk-new", 6));
    td_apikeys_destroy(k);

    /* load failures say which file and why */
    td_apikeys_t *none = NULL;
    CHECK_STATUS(td_apikeys_load(path, &none), TD_ERR_NOT_FOUND);
    CHECK(none == NULL);
    check_one_error(path, "No such file");
    rewrite(path, "# only comments\n\n");
    CHECK_STATUS(td_apikeys_load(path, &none), TD_ERR_INVALID);
    check_one_error(path, "no keys");
    char longkey[TD_APIKEYS_MAX_LEN + 3];
    memset(longkey, 'k', sizeof longkey - 2);
    longkey[sizeof longkey - 2] = '\n';
    longkey[sizeof longkey - 1] = '\0';
    rewrite(path, longkey);
    CHECK_STATUS(td_apikeys_load(path, &none), TD_ERR_INVALID);
    check_one_error(path, ":1: key longer than 512 bytes");
    longkey[sizeof longkey - 3] = '\n';
    longkey[sizeof longkey - 2] = '\0';
    rewrite(path, longkey);
    CHECK_STATUS(td_apikeys_load(path, &none), TD_OK);
    CHECK(none != NULL && td_apikeys_count(none) == 1);
    td_apikeys_destroy(none);
    unlink(path);
    free(path);
    td_log_set_sink(NULL, NULL);
}

int
main(void)
{
    test_bad_bodies();
    test_oversized_body();
    test_stop_cap();
    test_vllm_fields();
    test_good_chat();
    test_good_completion();
    test_token_prompt();
    test_good_logprobs_bias();
    test_responses();
    test_logprobs_json();
    test_streams();
    test_models_and_errors();
    test_sse();
    test_tok_bytes();
    test_choices_json();
    test_reply_reader();
    test_reply_budget();
    test_apikeys();
    return td_check_exit("test_openai");
}
