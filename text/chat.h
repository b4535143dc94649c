/* text/chat.h — what the two halves of the DeepSeek-V4.1 chat format share:
 * the special tokens as they are spelled, and the JSON string escaping both the
 * prompt (tool schemas) and the reply (tool-call arguments) write.
 * chat_prompt.h encodes a request, chat_reply.h reads a reply; docs/chat.md. */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include "buf.h"

#include <stddef.h>

/* The special tokens, spelled out (U+FF5C is "\xef\xbd\x9c", U+2581 "\xe2\x96\x81"). */
#define TD_CHAT_TOK_BOS       "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define TD_CHAT_TOK_EOS       "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define TD_CHAT_TOK_SYSTEM    "<\xef\xbd\x9cSystem\xef\xbd\x9c>"
#define TD_CHAT_TOK_USER      "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define TD_CHAT_TOK_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define TD_CHAT_TOK_REMINDER  "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define TD_CHAT_TOK_THINK     "<think>"
#define TD_CHAT_TOK_UNTHINK   "</think>"
#define TD_CHAT_TOK_DSML      "\xef\xbd\x9c" "DSML\xef\xbd\x9c"   /* U+FF5C DSML U+FF5C */

/* Every special token a prompt or a reply of this format may spell (*n of
 * them): a tokenizer must have each as a token to serve the format. */
const char *const *td_chat_special_tokens(size_t *n);

/* Append s[0, n) to b escaped for the inside of a JSON string, as Python's
 * json.dumps(ensure_ascii=False) writes it: ", \, \n, \r, \t, \b, \f escaped,
 * other control characters as \u00xx, everything else (non-ASCII, /, DEL) as
 * it is. A failed append is b's sticky failure. */
void td_chat_json_escape(td_buf_t *b, const char *s, size_t n);

#endif
