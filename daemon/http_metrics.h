/* daemon/http_metrics.h — optional HTTP listener serving GET /metrics
 * (metrics_listen in dted.conf; off by default).
 *
 * Deliberately minimal HTTP/1.1: one request per connection, the request
 * head capped at DHTTP_MAX_REQUEST bytes (over it: 431 and close), a
 * deadline for the whole exchange, GET or HEAD of /metrics answered with
 * the exposition, other paths 404, other methods 405, and the connection
 * closed after every reply.  No keep-alive, no bodies, no chunking.
 */
#ifndef DTED_HTTP_METRICS_H
#define DTED_HTTP_METRICS_H

#include <uv.h>

#define DHTTP_MAX_REQUEST 8192
#define DHTTP_MAX_CONNS   64
#define DHTTP_TIMEOUT_MS  5000

/* Listen on "host:port" (port 0: any).  -1 with a logged reason. */
int  dhttp_init(uv_loop_t *loop, const char *hostport);
/* Closes the listener and every connection; callbacks finish on the loop. */
void dhttp_fini(void);
/* The bound port (after init), 0 when not listening. */
int  dhttp_port(void);
/* "host:port" as bound ("" when not listening), and why the last init
 * did not listen ("" when it did).  Shown by `dtectl status`. */
const char *dhttp_address(void);
const char *dhttp_error(void);

#endif
