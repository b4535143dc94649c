/* text/chat.c — what the prompt encoder (chat_prompt.c) and the reply reader
 * (chat_reply.c) share: the format's special tokens and its JSON string
 * escaping. */
#include "chat.h"

#include <stdio.h>

static const char *const chat_tokens[] = {
    TD_CHAT_TOK_BOS, TD_CHAT_TOK_EOS, TD_CHAT_TOK_SYSTEM, TD_CHAT_TOK_USER,
    TD_CHAT_TOK_ASSISTANT, TD_CHAT_TOK_REMINDER, TD_CHAT_TOK_THINK, TD_CHAT_TOK_UNTHINK,
    TD_CHAT_TOK_DSML,
};

const char *const *
td_chat_special_tokens(size_t *n)
{
    *n = sizeof chat_tokens / sizeof chat_tokens[0];
    return chat_tokens;
}

void
td_chat_json_escape(td_buf_t *b, const char *s, size_t n)
{
    size_t run = 0;   /* start of the bytes copied unchanged */

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];

        switch (c) {
        case '"':  esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            td_buf_append(b, s + run, i - run);
            td_buf_puts(b, esc);
            run = i + 1;
        }
    }
    td_buf_append(b, s + run, n - run);
}
