/* ferry_segment_probe against real peer processes: alive, killed, frozen,
 * restarted; always within its bound. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/wait.h>

#include "capi_common.h"
#include "peer_process.h"
#include "test_clock.h"

TestSuite(probe, .init = capi_setup, .fini = capi_teardown, .timeout = 60);

Test(probe, live_peer_answers)
{
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ferry_segment_probe(capi_engine, segment, 2000), FERRY_OK);
    /* the default bound (timeout_ms <= 0: FERRY_RPC_TIMEOUT) */
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 0), FERRY_OK);
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, -1), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    peer_stop(&peer);
}

Test(probe, own_segment_is_alive)
{
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(capi_engine, ferry_engine_segment_name(capi_engine), &self),
                 FERRY_OK);
    cr_assert_eq(ferry_segment_probe(capi_engine, self, 100), FERRY_OK);
    ferry_segment_close(capi_engine, self);
}

Test(probe, bad_handles_are_refused)
{
    cr_assert_eq(ferry_segment_probe(NULL, NULL, 100), FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_segment_probe(capi_engine, NULL, 100), FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_segment_probe(capi_engine, (ferry_segment_h)(uintptr_t)0x1234, 100),
                 FERRY_ERR_INVALID_HANDLE);
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    ferry_segment_close(capi_engine, segment);
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 100), FERRY_ERR_INVALID_HANDLE,
                 "a closed segment's handle");
    peer_stop(&peer);
}

/* Hurt the peer with sig, probe it with timeout_ms: want its answer, in
 * [min_s, max_s) seconds.  The segment and the peer stay for the caller. */
static void probe_hurt_peer(peer_process_t *peer, ferry_segment_h segment, int sig,
                            int timeout_ms, ferry_status_t want, double min_s, double max_s)
{
    peer_kill(peer, sig);
    int stopped;
    /* SIGSTOP lands asynchronously: a probe sent first would be answered */
    if (sig == SIGSTOP)
        cr_assert_eq(waitpid(peer->pid, &stopped, WUNTRACED), peer->pid);
    double start = test_now();
    ferry_status_t got = ferry_segment_probe(capi_engine, segment, timeout_ms);
    cr_assert_eq(got, want, "probe: %s, want %s", ferry_status_string(got),
                 ferry_status_string(want));
    double elapsed = test_now() - start;
    cr_assert_geq(elapsed, min_s, "returned after %.3f s, before %.3f s", elapsed, min_s);
    cr_assert_lt(elapsed, max_s, "took %.2f s (bound: %.2f s)", elapsed, max_s);
}

Test(probe, killed_peer_fails_fast)
{
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    /* refused at once: nowhere near the 5 s bound */
    probe_hurt_peer(&peer, segment, SIGKILL, 5000, FERRY_ERR_PEER_FAILED, 0, 2.5);
    ferry_segment_close(capi_engine, segment);
}

Test(probe, frozen_peer_times_out_within_bound)
{
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    probe_hurt_peer(&peer, segment, SIGSTOP, 300, FERRY_ERR_TIMEOUT, 0.25, 3 * 0.3 + 1.0);
    /* thawed, it answers again: the probe left nothing behind */
    peer_kill(&peer, SIGCONT);
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 5000), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    peer_stop(&peer);
}

Test(probe, restarted_peer_is_stale_then_reached_again)
{
    personality(ADDR_NO_RANDOMIZE); /* the same arena address in both incarnations */
    peer_process_t first, second;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&first, NULL), 0);
    cr_assert_eq(ferry_segment_open(capi_engine, first.name, &segment), FERRY_OK);
    peer_kill(&first, SIGKILL);
    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(&first));
    const char *env[] = {address, NULL};
    cr_assert_eq(peer_start(&second, env), 0);
    cr_assert_str_eq(second.name, first.name);
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 2000), FERRY_ERR_STALE);
    /* the probe marked it stale: the next use fetches the new incarnation */
    cr_assert_str_eq(peer_cmd(&second, "reg 0 %d", 4096), "OK");
    cr_assert_eq(capi_write(segment, second.arena, 4096, 3), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %d 3", 4096), "OK");
    cr_assert_eq(ferry_segment_probe(capi_engine, segment, 2000), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    peer_stop(&second);
}
