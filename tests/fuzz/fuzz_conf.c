/* tests/fuzz/fuzz_conf.c — dted.conf parsing (daemon/conf.c over inih).
 *
 * The input is the file's text.  It is parsed twice, from a string
 * (dconf_load_string) and from a file (dconf_load_file on a memfd), and
 * the two must agree exactly.  Properties: the result is 0 or -1; an error
 * names "file:line" (or the file) with a message; on success every field
 * is inside its documented range and every string is terminated; then
 * dconf_finish leaves a terminated socket path and node name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/conf.h"
#include "daemon/log.h"
#include "tests/fuzz/fuzz_util.h"

#define TERMINATED(field) (memchr((field), 0, sizeof(field)) != NULL)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	dlog_init(DLOG_ERROR);
	return 0;
}

static void check_fields(const struct dconf *c)
{
	FUZZ_CHECK(c->max_frame_bytes >= DCONF_MIN_FRAME && c->max_frame_bytes <= DCONF_MAX_FRAME,
		   "max_frame_bytes %u", c->max_frame_bytes);
	FUZZ_CHECK(c->n_allow_uids <= DCONF_MAX_IDS && c->n_allow_gids <= DCONF_MAX_IDS,
		   "%u uids, %u gids", c->n_allow_uids, c->n_allow_gids);
	FUZZ_CHECK(c->log_level >= DLOG_ERROR && c->log_level <= DLOG_DEBUG, "log level %d",
		   c->log_level);
	FUZZ_CHECK(TERMINATED(c->socket) && TERMINATED(c->runtime_dir) &&
		   TERMINATED(c->socket_group) && TERMINATED(c->compute_backend) &&
		   TERMINATED(c->node_name) && TERMINATED(c->peer_listen_address),
		   "a string field is not terminated");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The string parser stops at a NUL; the file parser would not. */
	const uint8_t *nul = memchr(data, 0, size);
	size_t n = nul ? (size_t)(nul - data) : size;
	char *text = fuzz_cstr(data, n);
	struct dconf a, b;
	char erra[512] = "", errb[512] = "", path[64];
	int rca, rcb, fd;

	dconf_defaults(&a);
	dconf_defaults(&b);
	rca = dconf_load_string(&a, text, "fuzz.conf", erra, sizeof(erra));
	FUZZ_CHECK(rca == 0 || rca == -1, "rc %d", rca);

	fd = memfd_create("fuzz.conf", MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0, "memfd_create");
	FUZZ_CHECK(n == 0 || write(fd, text, n) == (ssize_t)n, "write");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	rcb = dconf_load_file(&b, path, errb, sizeof(errb));
	close(fd);

	FUZZ_CHECK(rca == rcb, "string parse %d, file parse %d (%s | %s)", rca, rcb, erra, errb);
	if (rca) {
		FUZZ_CHECK(strncmp(erra, "fuzz.conf:", 10) == 0 && erra[10],
			   "error without file name or message: '%s'", erra);
		/* Same line, same message: only the file name differs. */
		FUZZ_CHECK(strcmp(strchr(erra, ':'), errb + strlen(path)) == 0,
			   "string and file errors differ: '%s' vs '%s'", erra, errb);
	} else {
		FUZZ_CHECK(memcmp(&a, &b, sizeof(a)) == 0, "string and file parse differ");
		check_fields(&a);
		if (dconf_finish(&a, erra, sizeof(erra)) == 0) {
			check_fields(&a);
			FUZZ_CHECK(a.socket[0] && a.node_name[0], "no socket or node name after finish");
		} else {
			FUZZ_CHECK(erra[0], "finish failed without a message");
		}
	}
	free(text);
	return 0;
}
