#!/usr/bin/env bash
# Builds quantspec with the CUDA backend on the GPU machine (runs THERE, from the repository
# root, with .deb/bundle carried along; see tools/gpu/fetch_debs.sh and docs/cuda.md).
#
#   tools/gpu/build_on_device.sh [targets...]     # default: test_cuda bench_ops
#
# The bundle of Debian package contents is unpacked into a private prefix (never into /), and
# CMake is pointed at it. Afterwards `source build-gpu/env.sh` sets LD_LIBRARY_PATH for the binaries.
# Environment: QS_GPU_PREFIX (default /tmp/qs-deps), QS_GPU_BUILD (default build-gpu),
# QS_CUDA_ARCH (default 90a), QS_JOBS (default: all cores), QS_CMAKE_EXTRA (more -D arguments,
# e.g. where NCCL is: tools/gpu/multi_gpu.sh), QS_GPU_SERVER (default OFF; ON builds `quantspec
# serve` against the bundle's cpp-httplib, which runs with the machine's own libssl3 and
# libbrotli1: the bundle does not carry them, for the device tool's 64 MiB).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
prefix=${QS_GPU_PREFIX:-/tmp/qs-deps}
build=${QS_GPU_BUILD:-$repo/build-gpu}
arch=${QS_CUDA_ARCH:-90a}
jobs=${QS_JOBS:-$(nproc)}
targets=("$@")
((${#targets[@]})) || targets=(test_cuda bench_ops)

bundle=$repo/.deb/bundle/qs-deps.tar.xz
if [[ ! -f $bundle ]]; then
  echo "build_on_device: $bundle missing (run tools/gpu/fetch_debs.sh here; carry \".deb/bundle\")" >&2
  exit 1
fi

# --- unpack ------------------------------------------------------------------------------------
if [[ ! -f $prefix/.unpacked || $bundle -nt $prefix/.unpacked ]]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  tar -C "$prefix" -xJf "$bundle"
  touch "$prefix/.unpacked"
fi
libdir=$prefix/usr/lib/x86_64-linux-gnu
blasdir=$libdir/openblas-pthread
blasinc=$prefix/usr/include/x86_64-linux-gnu/openblas-pthread
if [[ ! -e $blasdir/libopenblas.so ]]; then
  # The bundle came without OpenBLAS (see fetch_debs.sh): build the stand-in under that name.
  mkdir -p "$blasdir"
  cc -O3 -march=native -fPIC -shared -I"$blasinc" -o "$blasdir/libopenblas.so" \
    "$repo/tools/gpu/cblas_shim.c"
  echo "build_on_device: OpenBLAS replaced by tools/gpu/cblas_shim.c"
fi

if [[ ${QS_GPU_SERVER:-OFF} == ON ]]; then
  # The bundle's -dev symlinks (libssl.so -> libssl.so.3, ...) name runtime libraries it does not
  # carry: point them at the machine's own copies.
  for link in "$libdir"/*.so; do
    [[ -L $link && ! -e $link ]] || continue
    target=$(basename "$(readlink "$link")")
    for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
      if [[ -e $dir/$target ]]; then
        ln -sf "$dir/$target" "$link"
        break
      fi
    done
    [[ -e $link ]] || echo "build_on_device: $(basename "$link"): no $target on this machine" >&2
  done
fi

# pkg-config for pkg_check_modules: the unpacked pkgconf, reading only the prefix's .pc files,
# with the prefix as sysroot (the .pc files say prefix=/usr).
mkdir -p "$prefix/bin"
cat >"$prefix/bin/pkg-config" <<EOF
#!/bin/sh
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$prefix/usr/bin/pkgconf" "\$@"
EOF
chmod +x "$prefix/bin/pkg-config"

# --- tools -------------------------------------------------------------------------------------
nvcc_bin=$(command -v nvcc || true)
[[ -n $nvcc_bin ]] || nvcc_bin=/usr/local/cuda/bin/nvcc
[[ -x $nvcc_bin ]] || { echo "build_on_device: nvcc not found" >&2; exit 1; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# The unpacked libraries (and OpenBLAS's libgfortran) must be found when linking and running.
runtime_path="$blasdir:$libdir"
export LD_LIBRARY_PATH="$runtime_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cmake -S "$repo" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DQS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc_bin" \
  -DQS_BUILD_TESTS=ON -DQS_BUILD_BENCH=ON -DQS_SERVER="${QS_GPU_SERVER:-OFF}" \
  -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DCMAKE_LIBRARY_PATH="$blasdir;$libdir" \
  -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libdir -Wl,-rpath-link,$blasdir" \
  -DPKG_CONFIG_EXECUTABLE="$prefix/bin/pkg-config" ${QS_CMAKE_EXTRA:-}

cmake --build "$build" -j "$jobs" --target "${targets[@]}"

cat >"$build/env.sh" <<EOF
export LD_LIBRARY_PATH="$runtime_path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
echo "build_on_device: built ${targets[*]} in $build"
