/* A CUDA driver-API check that needs nothing from the image but a C library: it loads the
 * libcuda.so.1 that Gantry added to the container, JIT-compiles a small PTX kernel (which needs the
 * driver's libnvidia-ptxjitcompiler, also added by Gantry), runs it on every visible GPU and checks the
 * result. Prints one "cudacheck: ..." line per GPU; exit 0 only when every GPU computed correctly.
 * Built against the image's C library: cc -O2 -o cudacheck cudacheck.c -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef unsigned long long CUdeviceptr;

static const char kPtx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry add_index(.param .u64 data, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [data];\n"
    "  ld.param.u32 %r2, [n];\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.u32 %p1, %r1, %r2;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r1, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r3, [%rd4];\n"
    "  add.u32 %r3, %r3, %r1;\n"
    "  st.global.u32 [%rd4], %r3;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

#define LOAD(var, name)                                                  \
    do {                                                                 \
        *(void**)(&var) = dlsym(cuda, name);                             \
        if (!var) {                                                      \
            fprintf(stderr, "cudacheck: libcuda.so.1 lacks %s\n", name); \
            return 1;                                                    \
        }                                                                \
    } while (0)

#define CHECK(call)                                                          \
    do {                                                                     \
        CUresult rc_ = (call);                                               \
        if (rc_ != 0) {                                                      \
            fprintf(stderr, "cudacheck: %s failed: error %d\n", #call, rc_); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

int main(void) {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "cudacheck: %s\n", dlerror());
        return 2;
    }
    CUresult (*cuInit)(unsigned), (*cuDeviceGetCount)(int*), (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDeviceGetName)(char*, int, CUdevice), (*cuDriverGetVersion)(int*);
    CUresult (*cuCtxCreate)(CUcontext*, unsigned, CUdevice), (*cuCtxDestroy)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule*, const void*), (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t), (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t), (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void**, void**);
    CUresult (*cuCtxSynchronize)(void);
    LOAD(cuInit, "cuInit");
    LOAD(cuDeviceGetCount, "cuDeviceGetCount");
    LOAD(cuDeviceGet, "cuDeviceGet");
    LOAD(cuDeviceGetName, "cuDeviceGetName");
    LOAD(cuDriverGetVersion, "cuDriverGetVersion");
    LOAD(cuCtxCreate, "cuCtxCreate_v2");
    LOAD(cuCtxDestroy, "cuCtxDestroy_v2");
    LOAD(cuModuleLoadData, "cuModuleLoadData");
    LOAD(cuModuleGetFunction, "cuModuleGetFunction");
    LOAD(cuMemAlloc, "cuMemAlloc_v2");
    LOAD(cuMemFree, "cuMemFree_v2");
    LOAD(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    LOAD(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    LOAD(cuLaunchKernel, "cuLaunchKernel");
    LOAD(cuCtxSynchronize, "cuCtxSynchronize");

    CHECK(cuInit(0));
    int version = 0, count = 0;
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&count));
    if (count == 0) {
        fprintf(stderr, "cudacheck: no CUDA device visible\n");
        return 3;
    }
    enum { N = 1 << 20 };
    unsigned* host = malloc(N * sizeof *host);
    if (!host) return 1;
    for (int d = 0; d < count; ++d) {
        CUdevice dev;
        CUcontext ctx;
        CUmodule mod;
        CUfunction fn;
        CUdeviceptr buf;
        char name[256] = "";
        CHECK(cuDeviceGet(&dev, d));
        CHECK(cuDeviceGetName(name, sizeof name, dev));
        CHECK(cuCtxCreate(&ctx, 0, dev));
        CHECK(cuModuleLoadData(&mod, kPtx)); /* the driver's PTX JIT compiler */
        CHECK(cuModuleGetFunction(&fn, mod, "add_index"));
        for (unsigned i = 0; i < N; ++i) host[i] = 7u * i + (unsigned)d;
        CHECK(cuMemAlloc(&buf, N * sizeof *host));
        CHECK(cuMemcpyHtoD(buf, host, N * sizeof *host));
        unsigned n = N;
        void* args[] = {&buf, &n};
        CHECK(cuLaunchKernel(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemcpyDtoH(host, buf, N * sizeof *host));
        for (unsigned i = 0; i < N; ++i)
            if (host[i] != 8u * i + (unsigned)d) {
                fprintf(stderr, "cudacheck: device %d (%s): element %u is %u, expected %u\n", d, name, i, host[i],
                        8u * i + (unsigned)d);
                return 4;
            }
        CHECK(cuMemFree(buf));
        CHECK(cuCtxDestroy(ctx));
        printf("cudacheck: device %d of %d: %s, CUDA driver %d.%d: PTX kernel over %d elements correct\n", d, count,
               name, version / 1000, version % 1000 / 10, N);
    }
    free(host);
    return 0;
}
