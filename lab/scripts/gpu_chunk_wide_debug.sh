#!/usr/bin/env bash
# chunk_wide cases one process each (a CUDA error does not spill into the next): which shapes and options fail.
cd "$(dirname "$0")/../.."
for c in "bf16 64 4 1 64 2011 17" "bf16 64 4 2 64 2011 17" "int2 64 4 1 64 2011 17" "int2 64 4 2 64 2011 17" \
         "bf16 64 4 2 32 2011 17" "int2 64 4 2 32 2011 17" "bf16 64 8 2 64 2011 17" "int2 128 8 2 64 2011 17" \
         "bf16 64 4 2 64 300 5" "int2 64 4 2 64 20011 64"; do
    timeout 60 python -m lab.scripts.chunk_wide_debug $c 2>&1 | grep -v Warning | tail -2
done
