# tessera: the one entry point.
#   make            build libtessera and the tessera command (build/release)
#   make test       install missing packages, set up the tests' Python and llama.cpp (cached
#                   outside the tree: tests/py_setup.sh, tests/llama_setup.sh), build under
#                   ASan+UBSan with -Werror, run every test
#   make test-long  the long soak and fuzz runs
#   make bench      benchmarks (release build)
#   make run        the main job
#   make install    install the command, the libraries (shared, core and static), the headers,
#                   tessera.pc for pkg-config, the manual page and the Python package under PREFIX
#   make uninstall  remove what make install put there
#   make CUDA=1     also build the CUDA kernels (kernels/cuda/*.cu) and link cuBLAS and NCCL

PREFIX ?= /usr/local
CC ?= cc
CUDA ?= 0
# each variant its own folder: the CUDA build beside the host-only one
BUILD ?= $(if $(filter 1,$(CUDA)),build/release-cuda,build/release)
OPT ?= -O2 -g
SAN ?=
WERROR ?=
FUZZ_SECONDS ?= 30

MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null)
INCLUDES := -Iinclude -Ibase -Ikernels -Ikernels/cuda -Iformats -Ireshard -Icomm -Istore -Ickpt -Itrain -Iconvert -Ilaunch -I/usr/include/libxml2 $(MPI_CFLAGS)
# -fPIC: the library's objects go into libtessera.so as well as libtessera.a;
# TSR_STORE_S3: the store opens s3:// (store/store_open.c; the core is built without)
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -DTSR_STORE_S3 -fPIC -pthread -fopenmp -Wall -Wextra -Wshadow -Wstrict-prototypes \
  -Wmissing-prototypes -Wno-unused-parameter $(WERROR) $(OPT) $(SAN) $(INCLUDES) $(CFLAGS)
SYS_LIBS := -lzstd -lxxhash -lisal -luring -lcjson -lcurl -lxml2 -linih -lcrypto -lopenblas
LDLIBS_ALL := $(SYS_LIBS) $(MPI_LIBS) -lm -pthread -fopenmp $(LDLIBS)

# The layers, bottom first (README, "Layout"): a folder includes only from
# folders before it (kernels/ from base/ only); tools/check_layers.sh checks it.
LAYERS := base kernels formats reshard comm store ckpt train convert launch
# The layers below the trainer: what the fuzz targets link.
CORE := base kernels formats reshard comm store ckpt
LIB_SRC := $(sort $(foreach d,$(CORE),$(wildcard $(d)/*.c)))
TRAIN_SRC := $(sort $(wildcard train/*.c convert/*.c launch/*.c))
TOOL_SRC := $(sort $(wildcard tools/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz_*.c))

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The CUDA build: kernels/cuda/*.cu for sm_90 (machine code and PTX) with the
# CUDA Toolkit in CUDA_HOME; TSR_CUDA tells the C code that devices exist.
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA_SRC := $(sort $(wildcard kernels/cuda/*.cu))
ifeq ($(CUDA),1)
CFLAGS_ALL += -DTSR_CUDA=1 -isystem $(CUDA_HOME)/include
LIB_OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.o)
LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64:$(CUDA_HOME)/lib \
  -lcublasLt -lcublas -lnccl -lcudart -lstdc++
endif
NVCC_WERROR := $(if $(WERROR),-Werror all-warnings -Xcompiler -Werror)
NVCCFLAGS := -std=c++17 -O2 -g -lineinfo -gencode arch=compute_90,code=[sm_90,compute_90] \
  -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter $(NVCC_WERROR) -DTSR_CUDA=1 $(INCLUDES)
TRAIN_OBJ := $(TRAIN_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TESTS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# The installed interface: tessera.h and the layer headers it gathers.
PUBLIC_HEADERS := include/tessera.h $(foreach d,$(LAYERS),$(wildcard $(d)/tsr_*.h))
HEADERS := $(wildcard include/*.h kernels/cuda/*.h $(foreach d,$(LAYERS) tools tests,$(d)/*.h))

# The shared library: libtessera.so.MAJOR.MINOR.PATCH, soname libtessera.so.MAJOR
# (tsr_base.h's version), the checkpoint library of the layers below the trainer.
VERSION := $(shell sed -n 's/^\#define TSR_VERSION_STRING "\(.*\)"/\1/p' base/tsr_base.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))
SONAME := libtessera.so.$(SOMAJOR)
SHLIB := $(BUILD)/libtessera.so.$(VERSION)

# The core libraries (README, "The library and its layout"), what the Python
# package loads: the checkpoint reader and writer, step directories and locks,
# with what they need of base/, kernels/ (byte planes, casts), formats/ and
# reshard/, over the POSIX store; no MPI, BLAS or OpenMP. libtessera-core.so has
# no S3 (its store_open.o is built without TSR_STORE_S3: s3:// is refused by
# name) and needs no libcurl either; libtessera-core-s3.so adds the S3 store and
# its client (libcurl, libxml2, libinih, libcrypto), for s3:// locations.
CORE_SRC := base/box.c base/common.c base/dtype.c base/pool.c kernels/casts.c kernels/planes.c \
  formats/codec.c formats/datafile.c formats/digest.c formats/stats.c $(wildcard formats/manifest*.c) reshard/layout.c reshard/plan.c \
  store/store.c store/store_fault.c store/store_posix.c \
  ckpt/fence.c ckpt/fence_write.c ckpt/lock.c ckpt/read.c ckpt/verify.c ckpt/save.c ckpt/save_merge.c ckpt/steps.c ckpt/synth.c
CORE_S3_SRC := store/store_s3.c $(wildcard store/s3*.c)
CORE_LIBS := -lzstd -lxxhash -lisal -luring -lm -pthread
CORE_S3_LIBS := -lcurl -lxml2 -linih -lcrypto
CORE_SONAME := libtessera-core.so.$(SOMAJOR)
CORE_SHLIB := $(BUILD)/libtessera-core.so.$(VERSION)
CORE_S3_SONAME := libtessera-core-s3.so.$(SOMAJOR)
CORE_S3_SHLIB := $(BUILD)/libtessera-core-s3.so.$(VERSION)
SHLIBS := $(SHLIB) $(CORE_SHLIB) $(CORE_S3_SHLIB)

# What the shared libraries export: the calls of the public headers and nothing
# else (no internal tsr_*, engine_* or s3_*), a linker version script that
# tools/exports.sh makes from PUBLIC_HEADERS, so that a new public call is
# exported with no second list to keep. The static libraries keep everything:
# the command and the tests use the internals.
EXPORTS := $(BUILD)/exports.map

.PHONY: all deps deps-test deps-bench test test-long bench bench-long run install uninstall clean fuzz layers cuda-variant
all: $(BUILD)/tessera $(BUILD)/libtessera.a $(SHLIBS) $(BUILD)/tessera.1

# The flags a folder was built with, in $(BUILD)/flags: every object and program
# depends on it, and it changes when the flags do, so that a folder never mixes
# objects of two sets of flags (CUDA=1 in a host-only folder, another SAN or OPT).
# $(BUILD)/make-vars keeps the variables that chose them, for a later make in
# the same folder (make install after make test: see tests/test_install.sh).
BUILD_FLAGS := $(CC) $(CFLAGS_ALL) | $(LDLIBS_ALL) | $(NVCCFLAGS)
ifneq ($(BUILD_FLAGS),$(file <$(BUILD)/flags))
$(shell mkdir -p $(BUILD))
$(file >$(BUILD)/flags,$(BUILD_FLAGS))
$(file >$(BUILD)/make-vars,OPT='$(OPT)' SAN='$(SAN)' WERROR='$(WERROR)' CUDA='$(CUDA)')
endif

$(BUILD)/%.o: %.c $(HEADERS) $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/%.o: %.cu $(HEADERS) $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libtessera.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(EXPORTS): $(PUBLIC_HEADERS) tools/exports.sh
	@mkdir -p $(dir $@)
	sh tools/exports.sh $(PUBLIC_HEADERS) > $@.tmp && mv $@.tmp $@

$(SHLIB): $(LIB_OBJ) $(EXPORTS)
	$(CC) $(CFLAGS_ALL) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined -Wl,--version-script=$(EXPORTS) \
	  $(LIB_OBJ) -o $@ $(LDLIBS_ALL)
	ln -sf $(notdir $@) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libtessera.so

# The core's store table without S3: store_open.c again, TSR_STORE_S3 undefined.
$(BUILD)/core/store_open.o: store/store_open.c $(HEADERS) $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -UTSR_STORE_S3 -c $< -o $@

# Linked without -fopenmp and the MPI and BLAS libraries: --no-undefined fails
# the link when a core object calls into anything else.
CORE_LINK := $(CC) $(OPT) $(SAN) -shared -pthread -Wl,--no-undefined -Wl,--version-script=$(EXPORTS)
$(CORE_SHLIB): $(CORE_SRC:%.c=$(BUILD)/%.o) $(BUILD)/core/store_open.o $(EXPORTS)
	$(CORE_LINK) -Wl,-soname,$(CORE_SONAME) $(filter %.o,$^) -o $@ $(CORE_LIBS)
	ln -sf $(notdir $@) $(BUILD)/$(CORE_SONAME)

$(CORE_S3_SHLIB): $(CORE_SRC:%.c=$(BUILD)/%.o) $(CORE_S3_SRC:%.c=$(BUILD)/%.o) $(BUILD)/store/store_open.o $(EXPORTS)
	$(CORE_LINK) -Wl,-soname,$(CORE_S3_SONAME) $(filter %.o,$^) -o $@ $(CORE_S3_LIBS) $(CORE_LIBS)
	ln -sf $(notdir $@) $(BUILD)/$(CORE_S3_SONAME)

# The manual page, from the command's own help.
$(BUILD)/tessera.1: $(BUILD)/tessera tools/man.sh
	sh tools/man.sh $(BUILD)/tessera > $@

# The trainer, the converters and the supervisor (train/, convert/, launch/) link the library; the
# command and the tests link both.
$(BUILD)/libtessera-train.a: $(TRAIN_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tessera: $(TOOL_OBJ) $(BUILD)/libtessera-train.a $(BUILD)/libtessera.a
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(LDLIBS_ALL)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libtessera-train.a $(BUILD)/libtessera.a $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests $< $(BUILD)/libtessera-train.a $(BUILD)/libtessera.a -o $@ $(LDLIBS_ALL)

# The layer rule, file and function sizes (README, "Layout").
layers:
	@sh tools/check_layers.sh

# Everything the tests run, the layer rule checked, and no circle of calls
# between files (tools/check_calls.sh, over the built objects).
tests: layers $(TESTS) $(BUILD)/tessera $(SHLIBS) $(BUILD)/tessera.1
	@sh tools/check_calls.sh $(BUILD)

# The Debian packages each goal needs (tools/deps.sh says which): make and make run
# only what builds and runs tessera; make test and make bench their tools too.
deps:
	@sh tools/deps.sh run
deps-test:
	@sh tools/deps.sh test
deps-bench:
	@sh tools/deps.sh bench

# Tests run under AddressSanitizer and UBSan, warnings as errors.
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
test: deps-test
	$(MAKE) --no-print-directory BUILD=build/asan OPT="-O1 -g" SAN="$(ASAN_FLAGS)" WERROR=-Werror tests
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory cuda-variant
	sh tests/run.sh build/asan build/fuzz $(FUZZ_SECONDS)

# libFuzzer targets, built with clang against the library (compiled once for all
# of them, instrumented for coverage); FUZZ_EXTRA_<target> names the sources
# above the library that a target also needs.
FUZZ_BIN := $(FUZZ_SRC:tests/%.c=build/fuzz/%)
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -DTSR_STORE_S3 -g -O1 -fno-sanitize-recover=undefined -pthread -fopenmp=libgomp $(INCLUDES)
FUZZ_EXTRA_fuzz_config := $(wildcard train/config*.c)
build/fuzz/fuzz_config: $(FUZZ_EXTRA_fuzz_config)
fuzz: $(FUZZ_BIN)
build/fuzz/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
build/fuzz/libtessera-fuzz.a: $(LIB_SRC:%.c=build/fuzz/obj/%.o)
	@rm -f $@
	ar rcs $@ $^
build/fuzz/%: tests/%.c build/fuzz/libtessera-fuzz.a $(HEADERS)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -Itests $< $(FUZZ_EXTRA_$*) build/fuzz/libtessera-fuzz.a \
	  -o $@ $(SYS_LIBS) $(MPI_LIBS) -lm -fopenmp=libgomp

# The CUDA variant (build/cuda), warnings as errors, wherever nvcc is, so that GPU
# code never rots; tests/run.sh runs its GPU test, which skips without a GPU.
cuda-variant:
	@if [ -x "$(NVCC)" ]; then \
	  $(MAKE) --no-print-directory CUDA=1 BUILD=build/cuda WERROR=-Werror all build/cuda/tests/test_cuda && \
	  sh tools/check_calls.sh build/cuda; \
	else echo "make test: no nvcc at $(NVCC): the CUDA variant is not built (CUDA_HOME=...)" >&2; fi

test-long: deps-test
	$(MAKE) --no-print-directory BUILD=build/asan OPT="-O1 -g" SAN="$(ASAN_FLAGS)" WERROR=-Werror tests
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory cuda-variant
	TSR_LONG=1 sh tests/run.sh build/asan build/fuzz 600

# Packages first, then a fresh make, so that the build sees what deps installed.
bench: deps-bench
	$(MAKE) --no-print-directory all
	sh tools/bench.sh $(BUILD)

# Effective training time over 20-minute chaos runs (about an hour in all), and
# over 30 minutes on the virtual cluster with a host killed every 5 minutes.
bench-long: deps-bench
	$(MAKE) --no-print-directory all
	sh tools/bench_chaos.sh $(BUILD)/tessera runs/bench/chaos-long long
	sh tools/bench_hosts.sh $(BUILD)/tessera runs/bench long

run: deps
	$(MAKE) --no-print-directory all
	sh tools/run.sh $(BUILD)

# Installed: the command; libtessera.so (with its soname and development links);
# the core libraries libtessera-core.so and libtessera-core-s3.so (with their
# sonames); libtessera.a and the trainer's libtessera-train.a; the public headers under
# include/tessera/ (tessera.h includes the layers' tsr_*.h); tessera.pc; tessera.1;
# the Python package (python/tessera) in PYDIR.
PC_LIBS_PRIVATE := $(SYS_LIBS) $(MPI_LIBS) -lm -fopenmp
# The Python package, where Debian's python3 looks for packages under PREFIX.
PYVER := $(shell /usr/bin/python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null || echo python3)
PYDIR ?= $(PREFIX)/lib/$(PYVER)/dist-packages
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/tessera \
	  $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PYDIR)/tessera
	install -m 755 $(BUILD)/tessera $(DESTDIR)$(PREFIX)/bin/tessera
	install -m 644 $(BUILD)/libtessera.a $(BUILD)/libtessera-train.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libtessera.so
	install -m 755 $(CORE_SHLIB) $(CORE_S3_SHLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf $(notdir $(CORE_SHLIB)) $(DESTDIR)$(PREFIX)/lib/$(CORE_SONAME)
	ln -sf $(notdir $(CORE_S3_SHLIB)) $(DESTDIR)$(PREFIX)/lib/$(CORE_S3_SONAME)
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(PREFIX)/include/tessera/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include/tessera' '' \
	  'Name: tessera' 'Description: tessera checkpoints: write, read, reshard, verify, S3' 'Version: $(VERSION)' \
	  'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -ltessera' 'Libs.private: $(PC_LIBS_PRIVATE)' \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/tessera.pc
	install -m 644 $(BUILD)/tessera.1 $(DESTDIR)$(PREFIX)/share/man/man1/tessera.1
	install -m 644 python/tessera/*.py $(DESTDIR)$(PYDIR)/tessera/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/tessera $(DESTDIR)$(PREFIX)/lib/libtessera.a \
	  $(DESTDIR)$(PREFIX)/lib/libtessera-train.a $(DESTDIR)$(PREFIX)/lib/libtessera.so* \
	  $(DESTDIR)$(PREFIX)/lib/libtessera-core.so* $(DESTDIR)$(PREFIX)/lib/libtessera-core-s3.so* \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig/tessera.pc $(DESTDIR)$(PREFIX)/share/man/man1/tessera.1
	rm -rf $(DESTDIR)$(PREFIX)/include/tessera $(DESTDIR)$(PYDIR)/tessera

clean:
	rm -rf build
