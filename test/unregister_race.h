/* Writers racing an unregister: the check of the unregister rule that the
 * one-sided transports (shm, ucx, GPU IPC) share. */
#ifndef FERRY_TEST_UNREGISTER_RACE_H
#define FERRY_TEST_UNREGISTER_RACE_H

#include <ferry/ferry.h>

#include <stdint.h>

#include "peer_process.h"

enum { UNREGISTER_RACE_WRITERS = 4, UNREGISTER_RACE_BLOCK = 1 << 20 };
/* The bytes the race writes, at remote. */
#define UNREGISTER_RACE_RANGE ((size_t)UNREGISTER_RACE_WRITERS * UNREGISTER_RACE_BLOCK)

/* UNREGISTER_RACE_WRITERS threads of engine write [remote, +RANGE) of the
 * peer's segment via that transport (NULL: the engine picks) while the peer
 * unregisters it, fills it with a canary and looks at it 80 ms later, six
 * times; it registers the range again in between so writes resume.  The
 * peer registered the range (areg) before. */
void unregister_under_writers(ferry_engine_h engine, ferry_segment_h segment,
                              peer_process_t *peer, uintptr_t remote, const char *via);

#endif
