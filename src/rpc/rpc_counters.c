/* Process-wide RPC counters (rpc.h): how many requests this process served
 * and made, and what its listeners did with connections. */
#include "rpc.h"

static atomic_uint_fast64_t counters[FERRY_RPC_COUNT_MAX];

static const char *const names[FERRY_RPC_COUNT_MAX] = {
    [FERRY_RPC_COUNT_SERVED_FETCH] = "rpc.served.fetch",
    [FERRY_RPC_COUNT_SERVED_NOTIFY] = "rpc.served.notify",
    [FERRY_RPC_COUNT_SERVED_PROBE] = "rpc.served.probe",
    [FERRY_RPC_COUNT_SERVED_INVALIDATE] = "rpc.served.invalidate",
    [FERRY_RPC_COUNT_SERVED_OTHER] = "rpc.served.other",
    [FERRY_RPC_COUNT_ACCEPTED] = "rpc.connections.accepted",
    [FERRY_RPC_COUNT_EVICTED] = "rpc.connections.evicted",
    [FERRY_RPC_COUNT_REFUSED] = "rpc.connections.refused",
    [FERRY_RPC_COUNT_CALLS] = "rpc.calls",
    [FERRY_RPC_COUNT_CALLS_FANNED_OUT] = "rpc.calls.fanned_out",
};

void ferry_rpc_counter_add(ferry_rpc_count_t which, uint64_t n)
{
    if (which < FERRY_RPC_COUNT_MAX)
        atomic_fetch_add_explicit(&counters[which], n, memory_order_relaxed);
}

uint64_t ferry_rpc_counter_get(ferry_rpc_count_t which)
{
    return which < FERRY_RPC_COUNT_MAX
               ? atomic_load_explicit(&counters[which], memory_order_relaxed)
               : 0;
}

const char *ferry_rpc_counter_name(ferry_rpc_count_t which)
{
    return which < FERRY_RPC_COUNT_MAX ? names[which] : NULL;
}
