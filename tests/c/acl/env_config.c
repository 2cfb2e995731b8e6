/* Prints what aclInit made of the environment (HETMEM_BACKEND, HETMEM_HOST_*): the aclInit
 * code and message, then the device count and each device's total memory. */
#include <inttypes.h>

#include "check.h"

int main(void) {
    aclError e = aclInit(NULL);
    printf("init %d %s\n", e, e == ACL_SUCCESS ? "" : aclGetRecentErrMsg());
    if (e != ACL_SUCCESS) {
        /* A refused configuration changes nothing: calls still say "not initialised". */
        EXPECT_CODE(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
        return 0;
    }
    uint32_t n = 0;
    OK(aclrtGetDeviceCount(&n));
    printf("devices %u\n", n);
    for (uint32_t d = 0; d < n; d++) {
        size_t free = 0, total = 0;
        OK(aclrtSetDevice((int32_t)d));
        OK(aclrtGetMemInfo(ACL_HBM_MEM, &free, &total));
        printf("device %u total %zu\n", d, total);
        OK(aclrtResetDevice((int32_t)d));
    }
    OK(aclFinalize());
    return 0;
}
