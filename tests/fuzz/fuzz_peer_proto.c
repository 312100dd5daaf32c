/* tests/fuzz/fuzz_peer_proto.c — decoding of the daemon-to-daemon records
 * (proto/peer.proto) through the generated protobuf-c code, as a daemon
 * decodes a UCX active message header from a peer.
 *
 * Input: [type u8][record...]; type picks the message (PeerMsgType order).
 * Properties: decode never reads outside the record (an exact-size heap
 * copy); a decoded record's known fields re-encode to bytes that decode to
 * a record that re-encodes identically (the encoding is stable), and the
 * packed size the library predicts is the size it writes.  Unknown fields
 * are left out of the re-encoding: protobuf-c 1.4 keeps e.g. a field
 * numbered 0 ("82 00") as unknown and then writes bytes it cannot decode;
 * daemons never forward records they received, so that is harmless.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "proto/peer.pb-c.h"
#include "tests/fuzz/fuzz_util.h"

static const ProtobufCMessageDescriptor *const types[] = {
	&dtep__join__descriptor,   &dtep__leave__descriptor,  &dtep__plan__descriptor,
	&dtep__counts__descriptor, &dtep__payload__descriptor, &dtep__staged__descriptor,
	&dtep__applied__descriptor, &dtep__refused__descriptor, &dtep__entry__descriptor,
	&dtep__participant__descriptor,
};

/* Unknown fields, nested ones included, are set aside while packing. */
struct unknown_saved {
	ProtobufCMessage *m;
	unsigned n;
};

struct unknown_list {
	struct unknown_saved *v;
	size_t n, cap;
};

static void strip_unknown(ProtobufCMessage *m, struct unknown_list *l)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 16;
		l->v = realloc(l->v, l->cap * sizeof(*l->v));
		if (!l->v)
			abort();
	}
	l->v[l->n].m = m;
	l->v[l->n++].n = m->n_unknown_fields;
	m->n_unknown_fields = 0;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char *member = (char *)m + f->offset;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t cnt = *(size_t *)((char *)m + f->quantifier_offset);
			ProtobufCMessage **arr = *(ProtobufCMessage ***)member;

			for (size_t k = 0; k < cnt; k++)
				if (arr[k])
					strip_unknown(arr[k], l);
			continue;
		}
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(uint32_t *)((char *)m + f->quantifier_offset) != f->id)
			continue;
		if (*(ProtobufCMessage **)member)
			strip_unknown(*(ProtobufCMessage **)member, l);
	}
}

static uint8_t *pack(ProtobufCMessage *m, size_t *len)
{
	struct unknown_list l = { 0 };
	size_t n;
	uint8_t *b;

	strip_unknown(m, &l);
	n = protobuf_c_message_get_packed_size(m);
	b = malloc(n ? n : 1);
	if (!b)
		abort();
	*len = protobuf_c_message_pack(m, b);
	/* Restored so that free_unpacked frees them. */
	for (size_t i = 0; i < l.n; i++)
		l.v[i].m->n_unknown_fields = l.v[i].n;
	free(l.v);
	FUZZ_CHECK(*len == n, "packed %zu bytes, predicted %zu", *len, n);
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	const ProtobufCMessageDescriptor *d = types[fuzz_u8(&in) % (sizeof(types) / sizeof(types[0]))];
	uint8_t *rec = malloc(in.n ? in.n : 1), *b1, *b2;
	ProtobufCMessage *m, *m2;
	size_t l1, l2;

	if (!rec)
		abort();
	memcpy(rec, in.p, in.n);
	m = protobuf_c_message_unpack(d, NULL, in.n, rec);
	free(rec);
	if (!m)
		return 0;
	FUZZ_CHECK(m->descriptor == d, "decoded as another type");
	b1 = pack(m, &l1);
	m2 = protobuf_c_message_unpack(d, NULL, l1, b1);
	FUZZ_CHECK(m2 != NULL, "%s: own encoding does not decode", d->name);
	b2 = pack(m2, &l2);
	FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0, "%s: encoding not stable", d->name);
	protobuf_c_message_free_unpacked(m, NULL);
	protobuf_c_message_free_unpacked(m2, NULL);
	free(b1);
	free(b2);
	return 0;
}
