"""One rank of the mpi4py job that test_mpi.py launches: every rank writes its
pattern into the next rank's buffer through the pmix store and `rank:N`
names, then checks what the previous rank wrote into its own."""

import sys

import numpy as np
from mpi4py import MPI

import ferry


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    with ferry.Engine() as engine:  # in a PMIx job: the pmix store, segment "rank:<rank>"
        if engine.segment_name != f"rank:{rank}":
            print(f"rank {rank}: segment named {engine.segment_name!r}", flush=True)
            return 1
        inbox = engine.alloc(1 << 16)
        inbox[:] = 0
        outbox = np.full(1 << 16, rank + 1, dtype=np.uint8)
        comm.Barrier()  # every rank's buffer is published
        peer = engine.open(f"rank:{(rank + 1) % size}")
        batch = engine.batch()
        batch.submit(ferry.Request(ferry.WRITE, outbox, peer, peer.buffers[0].addr))
        batch.notify(peer, f"from {rank}")
        batch.wait(timeout=60)
        comm.Barrier()  # every write is done
        expected = (rank - 1) % size + 1
        # The sender's wait returned once the owner queued the notify, so the
        # first look after the barrier finds it.
        notes = engine.notify_recv()
        ok = bool((inbox == expected).all()) and notes == [(f"rank:{(rank - 1) % size}",
                                                            f"from {(rank - 1) % size}".encode())]
        print(f"rank {rank}: {'OK' if ok else f'BAD {inbox[:4]} {notes}'}", flush=True)
        comm.Barrier()
        del inbox
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
