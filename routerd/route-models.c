/* routerd/route-models.c — GET /v1/models: the one model served, naming the
 * engine (the synthetic stand-in says so) and the tokenizer; in Anthropic's
 * shape for a request with anthropic-version. */
#include "anthropic.h"
#include "router.h"
#include "route.h"

void
td_route_models(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    td_openai_model_t m = { .id = r->model, .created = 0, .engine = r->engine_kind,
                            .tokenizer = r->tok->name };
    td_buf_t body = {0};

    /* a client of Anthropic's API sends its version; it gets its shape */
    if ((td_http_header(req, "anthropic-version") ? td_anthropic_models_json(&m, 1, &body)
                                                   : td_openai_models_json(&m, 1, &body)) ==
        TD_OK) {
        td_http_reply(req, 200, "application/json", body.data, body.len);
    } else {
        td_openai_err_t e;
        td_openai_err_internal(&e, "out of memory");
        td_http_reply_err(req, &e);
    }
    td_buf_free(&body);
}
