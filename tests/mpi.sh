# tests/mpi.sh: how the tests start MPI programs; sourced by tests/run.sh (once for every suite)
# and by tests/lib.sh (when a suite runs alone). Every rank of a test job is on this machine.
# With Open MPI's shared-memory transport (vader):
#
#   TEST_MCA   mpirun's options (tests/lib.sh: MPIRUN): shared memory between ranks, no network
#              transport to probe (they cost a quarter of a second at every start of 8 ranks),
#              and none of the components of the frameworks no test program uses (matching
#              transports, one-sided, MPI-IO, process topologies, the collectives that are
#              never selected): a rank opens, and then closes, every component it is not told
#              to leave alone, at every start.
#   OMPI_MCA_* the same settings for the programs started without mpirun (one rank), which
#              start no daemon (ess_singleton_isolated): 0.3 s a start instead of 1 s.
#   HWLOC_COMPONENTS  hwloc, which every rank runs in MPI_Init, skips the PCI devices (reading
#              each one's configuration space was the largest part of a rank's start-up).
#   HWLOC_PLUGINS_PATH  and loads none of its plugins (a directory that cannot exist): they
#              pull in OpenCL, X11 and libxml2 with ICU's data in every rank, which it maps,
#              relocates and unmaps at every start, for nothing these tests use: a 4-rank row
#              of tests/parallel (tiny, 5 steps) took 1.37 CPU s with them, 1.19 without
#              (6 runs each, alternated).
# Measured on the 2-core machine: a start of 4 ranks (MPI_Init, a barrier, MPI_Finalize) took
# 0.64 s of CPU, 0.49 s with these; a one-rank program without mpirun 1.1 s, 0.35 s.

if [ -z "${TEST_MCA+set}" ]; then
    TEST_MCA=""
    mpi_info=$(ompi_info 2> /dev/null)
    if echo "$mpi_info" | grep -q 'MCA btl: vader'; then
        TEST_MCA="--mca pml ob1 --mca btl self,vader"
        # framework:what the programs may use (the rest of its components is left out)
        for mpi_fw in mtl: osc:sm io: coll:basic,libnbc,self,sm,tuned topo:basic; do
            mpi_keep=,${mpi_fw#*:},
            mpi_fw=${mpi_fw%%:*}
            mpi_out=$(echo "$mpi_info" | sed -n "s/^ *MCA $mpi_fw: \([a-z0-9_]*\) .*/\1/p" |
                      while read -r c; do
                          case $mpi_keep in *,$c,*) ;; *) printf '%s,' "$c" ;; esac
                      done)
            [ -n "$mpi_out" ] && TEST_MCA="$TEST_MCA --mca $mpi_fw ^${mpi_out%,}"
        done
    fi
    unset mpi_info mpi_fw mpi_keep mpi_out
fi
export TEST_MCA
# the same as environment variables, for the programs started without mpirun
read -r -a mpi_words <<< "$TEST_MCA"
for ((mpi_i = 0; mpi_i + 2 < ${#mpi_words[@]}; mpi_i += 3)); do
    export "OMPI_MCA_${mpi_words[mpi_i + 1]}=${mpi_words[mpi_i + 2]}"
done
if [ -n "$TEST_MCA" ]; then
    export OMPI_MCA_ess_singleton_isolated=1 HWLOC_COMPONENTS=-pci,-linuxio \
        HWLOC_PLUGINS_PATH=/dev/null/none
fi
# OpenBLAS (Debian's threaded build, the one that may be called from several threads at once:
# its serial build may not, it gave other bits under the runtime's pool) starts a thread per
# core as it loads, before main, and they spin until the runtime holds it to one thread; in a
# one-rank program (not bound to a core by mpirun) that was 0.14 of its 0.35 CPU s (tiny, one
# step). The programs call OpenBLAS on one thread each way: the results are the same.
export OPENBLAS_NUM_THREADS=1
unset mpi_words mpi_i

# Open MPI keeps its session directories under $TMPDIR/ompi.<node>.<uid>/ and removes that
# directory when a job ends and finds it empty; a job starting at that moment beside it (the
# suites run side by side, and one-rank programs start without mpirun) fails ("A call to mkdir
# was unable to create the desired directory ... No such file or directory"). An empty
# directory of ours in it keeps it from ever being empty (a file would not do: the job's clean-up
# deletes the files it finds there, but does not descend into directories). The programs
# started without mpirun (isolated singletons, below) all use the same job directories in it,
# jf.0 and jf.0/1, which the same race empties (seen: "Directory: /tmp/ompi.vm.0/jf.0/1"):
# they get one of ours too.
mpi_node=$(uname -n)
for mpi_top in "ompi.$mpi_node.$(id -u)" "ompi.${mpi_node%%.*}.$(id -u)"; do
    mpi_top=${TMPDIR:-${TEMP:-${TMP:-/tmp}}}/$mpi_top
    mkdir -p -m 700 "$mpi_top" "$mpi_top/kept-by-tests" "$mpi_top/jf.0/kept-by-tests" \
        "$mpi_top/jf.0/1/kept-by-tests" 2> /dev/null
done
unset mpi_node mpi_top
