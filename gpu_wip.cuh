// gpu_wip.cuh: staging area for ninfer.cu's gpu sections (kernels, gpu forward). included
// once, from ninfer.cu, after the cpu reference; folded into ninfer.cu when it lands.
#pragma once
