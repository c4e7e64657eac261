# Helpers the contrib/bench-*.sh scripts share; sourced, not run.

# A free TCP port on loopback (for a server the script starts).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# Requests per batch for a block size: about 4-8 MiB in flight.
batch_for() {
    case $1 in
    64k) echo 128 ;;
    1m) echo 32 ;;
    *) echo 16 ;;
    esac
}
