/* daemon/dreply.c — the reply a control handler builds (its memory, its
 * message, deferral) and the descriptors a session received: what the
 * handlers (cmd_*.c) and the engine's deferred answers stand on.  Below
 * dispatch.c, which calls the handlers and packs what they built, so the
 * handlers never call back into the file that calls them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/dreply.h"

void dreply_defer(struct dreply *r)
{
	r->deferred = 1;
}

int dsess_take_fd(struct dsess *s)
{
	int fd;

	if (!s->nfds)
		return -1;
	fd = s->fds[0];
	memmove(s->fds, s->fds + 1, (s->nfds - 1) * sizeof(s->fds[0]));
	s->nfds--;
	return fd;
}

void *dreply_alloc(struct dreply *r, size_t size)
{
	struct dreply_block *b = calloc(1, sizeof(*b) + size);

	if (!b)
		return NULL;
	b->next = r->blocks;
	r->blocks = b;
	return b->data;
}

char *dreply_strdup(struct dreply *r, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = dreply_alloc(r, n);

	if (d)
		memcpy(d, s, n);
	return d;
}

void dreply_release(struct dreply *r)
{
	while (r->blocks) {
		struct dreply_block *b = r->blocks;

		r->blocks = b->next;
		free(b);
	}
}

void dreply_msg(struct dreply *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
}
