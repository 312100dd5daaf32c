#!/bin/bash
# tests/gpu/devrun.sh — build a self-contained bundle of what the GPU checks
# need (binaries built here, the shared libraries a bare GPU machine lacks),
# or, on the GPU machine, run them from that bundle:
#   tests/gpu/devrun.sh pack [dir]     (here, after make; default .devrun)
#   tests/gpu/devrun.sh run  [dir]     (there; logs under $OUT)
# Runs test_cuda, bench_gpu and py_cuda_ipc.py with the device's torch.
set -u
cmd=${1:-run}
D=${2:-.devrun}
case $cmd in
pack)
	B=${B:-build}
	rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/tests" "$D/syslib/ucx"
	cp "$B/bin/dted" "$B/bin/dtectl" "$D/bin/"
	cp "$B/lib/libdte.so.0" "$B/lib/dte-cuda.so" "$D/lib/"
	cp "$B/tests/test_cuda" "$B/tests/bench_gpu" "$D/tests/"
	for f in $(ldd "$B/bin/dted" "$B/lib/libdte.so.0" | awk '/=>/ {print $3}' | sort -u); do
		case $(basename "$f") in
		libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
		*) cp -L "$f" "$D/syslib/" ;;
		esac
	done
	cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 /usr/lib/x86_64-linux-gnu/ucx/libucx_perftest_*.so.0 \
		"$D/syslib/ucx/" 2>/dev/null
	# A binary caught mid-relink (another make running) would travel empty.
	for f in "$D"/bin/* "$D"/lib/* "$D"/tests/*; do
		if [ ! -s "$f" ]; then
			echo "devrun: $f is empty (still being linked?); run pack again" >&2
			exit 1
		fi
	done
	du -sh "$D"
	;;
run)
	OUT=${OUT:-/tmp/devrun-out}
	mkdir -p "$OUT"
	export LD_LIBRARY_PATH=$PWD/$D/syslib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export B=$PWD/$D DTE_CUDA_PLUGIN=$PWD/$D/lib/dte-cuda.so PYTHONUNBUFFERED=1
	PY=${PY:-/opt/torch/.venv/bin/python}
	{
		nvidia-smi -L; ldd --version | head -1
		ldd "$D/bin/dted" "$D/lib/libdte.so.0" | grep -i "not found" || echo "libs: all found"
		$PY -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
	} >"$OUT/env.log" 2>&1
	rc=0
	timeout 80 "$D/tests/test_cuda" "$D/lib/dte-cuda.so" >"$OUT/test_cuda.log" 2>&1 || rc=1
	timeout 50 "$D/tests/bench_gpu" "$D/lib/dte-cuda.so" >"$OUT/bench_gpu.log" 2>&1 || rc=1
	timeout 100 $PY tests/gpu/py_cuda_ipc.py >"$OUT/py_cuda_ipc.log" 2>&1 || rc=1
	tail -n 3 "$OUT"/*.log
	exit $rc
	;;
esac
