# Lab: lab.benchmarks.tp_debug with a deadline; past it every process prints its Python stacks (SIGUSR1).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=WARN
python3 -m lab.benchmarks.tp_debug oscar > $OUT/tp_debug.txt 2>&1 &
pid=$!
timeout ${1:-150} tail --pid=$pid -f /dev/null || { pkill -USR1 -f "python3 -m benchmarks|spawn_main"; sleep 3; kill -9 $pid; pkill -9 -f spawn_main; }
tail -c 9000 $OUT/tp_debug.txt
