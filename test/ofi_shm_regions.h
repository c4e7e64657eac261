/* What libfabric 1.17's shm provider leaves behind a killed process: its
 * endpoints' regions in /dev/shm (16 MiB each), under the names the ofi
 * module gives them (ferry-<pid>-*).  Shared by the ofi suites. */
#ifndef FERRY_TEST_OFI_SHM_REGIONS_H
#define FERRY_TEST_OFI_SHM_REGIONS_H

#include <stddef.h>
#include <sys/types.h>

#include "peer_process.h"

/* How many regions pid's endpoints have in /dev/shm; removed when remove
 * is set. */
size_t ofi_shm_regions_of(pid_t pid, int remove);
/* Kill a peer (SIGKILL) and remove what its shm endpoints left. */
void ofi_kill_peer(peer_process_t *peer);

#endif
