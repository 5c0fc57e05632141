#!/usr/bin/env bash
# Installs the system packages kvslice needs on a Debian machine with no GPU:
# Mesa's lavapipe (software Vulkan) so wgpu finds an adapter, the Vulkan loader, Mesa's EGL and
# llvmpipe GL driver (the second API `kvslice doctor` checks kernels on), and a TTF
# font for the evaluation's PNG plots; Chromium and Node.js (npm) for the browser demo's
# end-to-end test (WebGPU on the CPU through Chromium's SwiftShader, driven by playwright-core).
set -euo pipefail
need=()
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || need+=(libvulkan1)
dpkg -s libegl1 >/dev/null 2>&1 || need+=(libegl1)
dpkg -s libegl-mesa0 >/dev/null 2>&1 || need+=(libegl-mesa0)
dpkg -s libgl1-mesa-dri >/dev/null 2>&1 || need+=(libgl1-mesa-dri)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || need+=(fonts-dejavu-core)
dpkg -s chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "installing: ${need[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
