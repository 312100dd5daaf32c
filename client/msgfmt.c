/* client/msgfmt.c — descriptor-driven printing and argument parsing. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "client/msgfmt.h"

static const void *field_ptr(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd)
{
	return (const char *)m + fd->offset;
}

/* proto3 scalars have no presence; oneof members only count when chosen. */
static int field_present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd)
{
	if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
		return *(const uint32_t *)((const char *)m + fd->quantifier_offset) == fd->id;
	if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED)
		return *(ProtobufCMessage *const *)field_ptr(m, fd) != NULL;
	return 1;
}

static size_t field_count(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd)
{
	if (fd->label == PROTOBUF_C_LABEL_REPEATED)
		return *(const size_t *)((const char *)m + fd->quantifier_offset);
	return field_present(m, fd) ? 1 : 0;
}

/* Address of element i of a (possibly repeated) field. */
static const void *elem(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd, size_t i,
			size_t size)
{
	if (fd->label == PROTOBUF_C_LABEL_REPEATED)
		return *(const char *const *)field_ptr(m, fd) + i * size;
	return field_ptr(m, fd);
}

static size_t type_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	default: return 4;
	}
}

static json_t *scalar_json(const ProtobufCFieldDescriptor *fd, const void *p)
{
	switch (fd->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
		return json_integer(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
		return json_integer(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
		return json_integer(*(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
		uint64_t v = *(const uint64_t *)p;
		char buf[24];

		/* jansson integers are int64: larger values (checksums) go out as
		 * decimal strings rather than wrapping negative. */
		if (v <= (uint64_t)INT64_MAX)
			return json_integer((json_int_t)v);
		snprintf(buf, sizeof(buf), "%" PRIu64, v);
		return json_string(buf);
	}
	case PROTOBUF_C_TYPE_FLOAT: return json_real(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE: return json_real(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(const char *const *)p;

		return json_string(s ? s : "");
	}
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *v =
			protobuf_c_enum_descriptor_get_value(fd->descriptor, *(const int *)p);

		return v ? json_string(v->name) : json_integer(*(const int *)p);
	}
	case PROTOBUF_C_TYPE_BYTES:
		return json_integer((json_int_t)((const ProtobufCBinaryData *)p)->len);
	case PROTOBUF_C_TYPE_MESSAGE:
		return dte_msg_to_json(*(ProtobufCMessage *const *)p);
	}
	return json_null();
}

json_t *dte_msg_to_json(const ProtobufCMessage *m)
{
	json_t *o = json_object();

	if (!m)
		return o;
	for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &m->descriptor->fields[i];
		size_t n = field_count(m, fd), sz = type_size(fd->type);

		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			json_t *a = json_array();

			for (size_t k = 0; k < n; k++)
				json_array_append_new(a, scalar_json(fd, elem(m, fd, k, sz)));
			json_object_set_new(o, fd->name, a);
		} else if (n) {
			json_object_set_new(o, fd->name, scalar_json(fd, elem(m, fd, 0, sz)));
		}
	}
	return o;
}

/* Ids and epochs print in hex, the digits the daemon's log prints (with
 * 0x, which arguments accept back); spec hashes as `dtectl plan` prints
 * them.  JSON keeps every number a number. */
static const char *hex_format(const ProtobufCFieldDescriptor *fd)
{
	if (fd->type != PROTOBUF_C_TYPE_UINT64 && fd->type != PROTOBUF_C_TYPE_FIXED64)
		return NULL;
	if (!strcmp(fd->name, "id") || !strcmp(fd->name, "epoch") ||
	    !strcmp(fd->name, "participant") || !strcmp(fd->name, "sink"))
		return "0x%" PRIx64;
	if (!strcmp(fd->name, "spec_hash"))
		return "%016" PRIx64;
	return NULL;
}

static void print_scalar(FILE *f, const ProtobufCFieldDescriptor *fd, const void *p)
{
	const char *hex = hex_format(fd);
	json_t *j;

	if (hex) {
		fprintf(f, hex, *(const uint64_t *)p);
		return;
	}
	j = scalar_json(fd, p);
	if (json_is_string(j))
		fputs(json_string_value(j), f);
	else if (json_is_integer(j) && (fd->type == PROTOBUF_C_TYPE_UINT64 ||
					fd->type == PROTOBUF_C_TYPE_FIXED64))
		fprintf(f, "%" PRIu64, *(const uint64_t *)p);
	else if (json_is_integer(j))
		fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
	else if (json_is_real(j))
		fprintf(f, "%g", json_real_value(j));
	else if (json_is_boolean(j))
		fputs(json_is_true(j) ? "true" : "false", f);
	json_decref(j);
}

void dte_msg_print(FILE *f, const ProtobufCMessage *m, const char *prefix)
{
	char sub[256];

	if (!m)
		return;
	for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &m->descriptor->fields[i];
		size_t n = field_count(m, fd), sz = type_size(fd->type);

		if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
			for (size_t k = 0; k < n; k++) {
				if (fd->label == PROTOBUF_C_LABEL_REPEATED)
					snprintf(sub, sizeof(sub), "%s%s[%zu].", prefix, fd->name, k);
				else
					snprintf(sub, sizeof(sub), "%s%s.", prefix, fd->name);
				dte_msg_print(f, *(ProtobufCMessage *const *)elem(m, fd, k, sz), sub);
			}
			continue;
		}
		if (fd->label == PROTOBUF_C_LABEL_REPEATED || n) {
			fprintf(f, "%s%s: ", prefix, fd->name);
			for (size_t k = 0; k < n; k++) {
				if (k)
					fputc(',', f);
				print_scalar(f, fd, elem(m, fd, k, sz));
			}
			fputc('\n', f);
		}
	}
}

static int set_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd, char *v,
		     char *err, size_t errlen)
{
	void *p = (char *)m + fd->offset;
	char *end = NULL;

	if (fd->label == PROTOBUF_C_LABEL_REPEATED || fd->type == PROTOBUF_C_TYPE_MESSAGE ||
	    fd->type == PROTOBUF_C_TYPE_BYTES) {
		snprintf(err, errlen, "%s: cannot be set from the command line", fd->name);
		return -1;
	}
	errno = 0;
	switch (fd->type) {
	case PROTOBUF_C_TYPE_STRING:
		*(char **)p = v;
		break;
	case PROTOBUF_C_TYPE_BOOL:
		if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "1") && strcmp(v, "0"))
			goto bad;
		*(protobuf_c_boolean *)p = !strcmp(v, "true") || !strcmp(v, "1");
		break;
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *ev =
			protobuf_c_enum_descriptor_get_value_by_name(fd->descriptor, v);

		if (!ev)
			goto bad;
		*(int *)p = ev->value;
		break;
	}
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: {
		unsigned long long x = strtoull(v, &end, 0);

		if (*v == '-' || errno || *end || x > UINT32_MAX)
			goto bad;
		*(uint32_t *)p = (uint32_t)x;
		break;
	}
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
		unsigned long long x = strtoull(v, &end, 0);

		if (*v == '-' || errno || *end)
			goto bad;
		*(uint64_t *)p = x;
		break;
	}
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: {
		long long x = strtoll(v, &end, 0);

		if (errno || *end || x < INT32_MIN || x > INT32_MAX)
			goto bad;
		*(int32_t *)p = (int32_t)x;
		break;
	}
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64: {
		long long x = strtoll(v, &end, 0);

		if (errno || *end)
			goto bad;
		*(int64_t *)p = x;
		break;
	}
	case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE: {
		double x = strtod(v, &end);

		if (errno || *end)
			goto bad;
		if (fd->type == PROTOBUF_C_TYPE_FLOAT)
			*(float *)p = (float)x;
		else
			*(double *)p = x;
		break;
	}
	default:
		goto bad;
	}
	if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
		*(uint32_t *)((char *)m + fd->quantifier_offset) = fd->id;
	return 0;
bad:
	snprintf(err, errlen, "%s: invalid value '%s'", fd->name, v);
	return -1;
}

int dte_msg_from_args(ProtobufCMessage *m, int argc, char **argv, char *err, size_t errlen)
{
	unsigned next = 0;

	for (int i = 0; i < argc; i++) {
		const ProtobufCFieldDescriptor *fd;
		char *eq = strchr(argv[i], '=');
		char *v = argv[i];

		if (eq) {
			char name[64];
			size_t n = (size_t)(eq - argv[i]);

			if (n >= sizeof(name))
				n = sizeof(name) - 1;
			memcpy(name, argv[i], n);
			name[n] = '\0';
			fd = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
			if (!fd) {
				snprintf(err, errlen, "unknown argument '%s'", name);
				return -1;
			}
			v = eq + 1;
		} else {
			if (next >= m->descriptor->n_fields) {
				snprintf(err, errlen, "too many arguments at '%s'", argv[i]);
				return -1;
			}
			fd = &m->descriptor->fields[next++];
		}
		if (set_field(m, fd, v, err, errlen) < 0)
			return -1;
	}
	return 0;
}
