/* proto/peer_auth.c — job keys and record MACs (proto/peer_auth.h), on
 * libsodium: the key by BLAKE2b, a record's MAC by Poly1305 under a
 * one-time key from XChaCha20. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "proto/peer_auth.h"

static const char tag[] = "dted-peer-record-v9";

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

/* The tag of a record under the one-time key XChaCha20(key, nonce)'s
 * first 32 bytes (the construction of XChaCha20-Poly1305's tag, here
 * over the record's encoding rather than a ciphertext): Poly1305 over the
 * domain tag, the type, the header's length and bytes, the data's length
 * and bytes.  A random 192-bit nonce per record makes each key one-time. */
static int mac_tag(const uint8_t key[PEER_AUTH_KEYBYTES], const uint8_t *nonce, unsigned type,
		   const ProtobufCMessage *msg, ProtobufCBinaryData *field, const void *data,
		   size_t len, uint8_t tagout[PEER_AUTH_TAGBYTES])
{
	ProtobufCBinaryData keep = *field;
	crypto_onetimeauth_state st;
	uint8_t stackbuf[512], *hdr, le[8], otk[crypto_onetimeauth_KEYBYTES];
	size_t hdrlen;

	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED) {
		data = NULL;	/* peer_auth.h: the relayed record's MAC covers it */
		len = 0;
	}
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
	crypto_stream_xchacha20(otk, sizeof(otk), nonce, key);
	crypto_onetimeauth_init(&st, otk);
	crypto_onetimeauth_update(&st, (const unsigned char *)tag, sizeof(tag));
	for (int i = 0; i < 4; i++)
		le[i] = (uint8_t)(type >> (8 * i));
	crypto_onetimeauth_update(&st, le, 4);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)hdrlen >> (8 * i));
	crypto_onetimeauth_update(&st, le, 8);
	crypto_onetimeauth_update(&st, hdr, hdrlen);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)len >> (8 * i));
	crypto_onetimeauth_update(&st, le, 8);
	if (len)
		crypto_onetimeauth_update(&st, data, len);
	crypto_onetimeauth_final(&st, tagout);
	sodium_memzero(otk, sizeof(otk));
	sodium_memzero(&st, sizeof(st));
	if (hdr != stackbuf)
		free(hdr);
	return 0;
}

int peer_auth_mac(const uint8_t key[PEER_AUTH_KEYBYTES], unsigned type,
		  const ProtobufCMessage *msg, const void *data, size_t len,
		  uint8_t mac[PEER_AUTH_MACBYTES])
{
	ProtobufCBinaryData *field = peer_auth_mac_field(msg);

	if (!field)
		return -EINVAL;
	randombytes_buf(mac, PEER_AUTH_MAC_NONCEBYTES);
	return mac_tag(key, mac, type, msg, field, data, len, mac + PEER_AUTH_MAC_NONCEBYTES);
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
	ProtobufCBinaryData *field = peer_auth_mac_field(msg);
	uint8_t got[PEER_AUTH_MACBYTES], want[PEER_AUTH_TAGBYTES];
	int rc;

	if (!field)
		return -EINVAL;
	if (field->len != PEER_AUTH_MACBYTES || !field->data)
		return -ENOKEY;
	/* The field is emptied while the header is packed: its bytes first. */
	memcpy(got, field->data, sizeof(got));
	if ((rc = mac_tag(key, got, type, msg, field, data, len, want)) < 0)
		return rc;
	return crypto_verify_16(want, got + PEER_AUTH_MAC_NONCEBYTES) == 0 ? 0 : -EBADMSG;
}
