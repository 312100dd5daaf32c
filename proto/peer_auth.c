/* proto/peer_auth.c — job keys and record MACs (proto/peer_auth.h), on
 * libsodium's BLAKE2b. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "proto/peer_auth.h"

static const char tag[] = "dted-peer-record-v5";

int peer_auth_init(void)
{
	return sodium_init() < 0 ? -EIO : 0;
}

void peer_auth_key(uint8_t key[PEER_AUTH_KEYBYTES], const char *job, const char *token)
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, PEER_AUTH_KEYBYTES);
	crypto_generichash_update(&st, (const unsigned char *)"dted-job", sizeof("dted-job"));
	crypto_generichash_update(&st, (const unsigned char *)job, strlen(job) + 1);
	crypto_generichash_update(&st, (const unsigned char *)token, strlen(token) + 1);
	crypto_generichash_final(&st, key, PEER_AUTH_KEYBYTES);
	sodium_memzero(&st, sizeof(st));
}

void peer_auth_random(void *buf, size_t len)
{
	randombytes_buf(buf, len);
}

Dtep__JobRef *peer_auth_ref(const ProtobufCMessage *msg)
{
	const ProtobufCFieldDescriptor *f;

	if (!msg || msg->descriptor == &dtep__refused__descriptor)
		return NULL;
	f = protobuf_c_message_descriptor_get_field(msg->descriptor, 1);
	if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE || f->descriptor != &dtep__job_ref__descriptor)
		return NULL;
	return *(Dtep__JobRef **)((char *)msg + f->offset);
}

ProtobufCBinaryData *peer_auth_mac_field(const ProtobufCMessage *msg)
{
	Dtep__JobRef *ref;

	if (msg && msg->descriptor == &dtep__refused__descriptor)
		return &((Dtep__Refused *)msg)->mac;
	ref = peer_auth_ref(msg);
	return ref ? &ref->mac : NULL;
}

int peer_auth_mac(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type,
		  const ProtobufCMessage *msg, const void *data, size_t len,
		  uint8_t mac[PEER_AUTH_MACBYTES])
{
	ProtobufCBinaryData *field = peer_auth_mac_field(msg), keep;
	crypto_generichash_state st;
	uint8_t stackbuf[512], *hdr, le[8];
	size_t hdrlen;

	if (!field)
		return -EINVAL;
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED) {
		data = NULL;	/* peer_auth.h: the relayed record's MAC covers it */
		len = 0;
	}
	keep = *field;
	field->len = 0;
	field->data = NULL;
	hdrlen = protobuf_c_message_get_packed_size(msg);
	hdr = hdrlen <= sizeof(stackbuf) ? stackbuf : malloc(hdrlen);
	if (!hdr) {
		*field = keep;
		return -ENOMEM;
	}
	protobuf_c_message_pack(msg, hdr);
	*field = keep;
	crypto_generichash_init(&st, key, PEER_AUTH_KEYBYTES, PEER_AUTH_MACBYTES);
	crypto_generichash_update(&st, (const unsigned char *)tag, sizeof(tag));
	for (int i = 0; i < 4; i++)
		le[i] = (uint8_t)(type >> (8 * i));
	crypto_generichash_update(&st, le, 4);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)hdrlen >> (8 * i));
	crypto_generichash_update(&st, le, 8);
	crypto_generichash_update(&st, hdr, hdrlen);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)len >> (8 * i));
	crypto_generichash_update(&st, le, 8);
	if (len)
		crypto_generichash_update(&st, data, len);
	crypto_generichash_final(&st, mac, PEER_AUTH_MACBYTES);
	if (hdr != stackbuf)
		free(hdr);
	return 0;
}

int peer_auth_seal(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type, ProtobufCMessage *msg,
		   const void *data, size_t len, uint8_t macbuf[PEER_AUTH_MACBYTES])
{
	Dtep__JobRef *ref = peer_auth_ref(msg);
	int rc;

	if (!ref)
		return -EINVAL;
	ref->token = (char *)protobuf_c_empty_string;
	if ((rc = peer_auth_mac(key, type, msg, data, len, macbuf)) < 0)
		return rc;
	ref->mac.data = macbuf;
	ref->mac.len = PEER_AUTH_MACBYTES;
	return 0;
}

int peer_auth_check(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type,
		    const ProtobufCMessage *msg, const void *data, size_t len)
{
	const ProtobufCBinaryData *field = peer_auth_mac_field(msg);
	uint8_t want[PEER_AUTH_MACBYTES];
	int rc;

	if (!field)
		return -EINVAL;
	if (field->len != PEER_AUTH_MACBYTES || !field->data)
		return -ENOKEY;
	if ((rc = peer_auth_mac(key, type, msg, data, len, want)) < 0)
		return rc;
	return crypto_verify_32(want, field->data) == 0 ? 0 : -EBADMSG;
}
