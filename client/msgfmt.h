/* client/msgfmt.h — protobuf messages as dtectl text, as JSON, and from
 * command-line arguments, driven by the protobuf-c descriptors so a new
 * command's reply prints without new client code.
 *
 * Text: one `name: value` line per field; nested messages prefix their
 * fields with `name.`, repeated ones with `name[i].`; repeated scalars are
 * comma separated.  JSON: an object with the same names.
 */
#ifndef DTE_MSGFMT_H
#define DTE_MSGFMT_H

#include <stdio.h>
#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

void dte_msg_print(FILE *f, const ProtobufCMessage *m, const char *prefix);
json_t *dte_msg_to_json(const ProtobufCMessage *m);

/* Set fields of `m` from args: `name=value`, or bare values taken in field
 * order.  Supports string, bool, enum (by value name) and integer scalars.
 * Strings point into argv (keep it alive).  -1 with a message in err. */
int dte_msg_from_args(ProtobufCMessage *m, int argc, char **argv, char *err, size_t errlen);

#endif
