/*
 * Forged descriptors: the descriptor a metadata store (ferry_metad, see
 * service_start_forgery_store) holds for one segment, published again under
 * another name with one piece of it changed.  An initiator that opens the
 * new name uses the forgery; the owner, who never published it, serves the
 * requests.  Tests use it to reach the checks a well-behaved initiator
 * never lets a request get to (the target's, the transport's).
 */
#ifndef FERRY_TEST_FORGED_STORE_H
#define FERRY_TEST_FORGED_STORE_H

#include <stddef.h>

/* The store's JSON for segment name (asserts it is there), in out. */
void forged_store_fetch(int port, const char *name, char *out, size_t size);
/* Publish the store's descriptor of segment `from` as segment `to`, the first
 * occurrence of find (NULL: none) replaced by replace. */
void forged_store_publish(int port, const char *from, const char *to, const char *find,
                          const char *replace);

#endif
