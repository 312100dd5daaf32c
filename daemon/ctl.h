/* daemon/ctl.h — the control socket server (Unix stream, libuv).
 *
 * Binds the socket (or adopts one passed by systemd socket activation),
 * checks each client's SO_PEERCRED against the allow list, reads frames
 * into bounded per-connection buffers and answers through ddispatch().
 * A protocol error closes that connection only.
 */
#ifndef DTED_CTL_H
#define DTED_CTL_H

#include <uv.h>
#include "daemon/dispatch.h"

struct dconf;

/* Listen on conf->socket (creating its directory 0750 and the socket 0660)
 * unless systemd passed a listening socket.  `srv` must outlive dctl. */
int dctl_init(uv_loop_t *loop, struct dsrv *srv);

/* Stop listening, close every connection, remove the socket file if this
 * process created it.  Handles finish closing on the next loop run. */
void dctl_fini(void);

/* Send a deferred reply (see dreply_defer) to connection conn_id; -1 when
 * that connection is gone or closing (the reply is dropped). */
int dctl_reply(uint64_t conn_id, Dte__Response *resp);

/* Path served ("(socket activation)" when adopted from systemd). */
const char *dctl_path(void);

#endif
