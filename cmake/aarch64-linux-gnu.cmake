# Cross build for aarch64 Linux with Debian's cross toolchain (gcc-aarch64-linux-gnu);
# ctest runs the programs under qemu-user. `make check-arm` uses it. The arm64
# libraries dflash links come from DFLASH_ARM_SYSROOT (the environment variable;
# scripts/arm_sysroot.sh unpacks Debian's packages there).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
set(sysroot "$ENV{DFLASH_ARM_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR} "${sysroot}/usr/lib/aarch64-linux-gnu/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${sysroot}")
set(CMAKE_FIND_ROOT_PATH "${sysroot}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
