/* The shareable-handle file of aclrtMemExportToShareableHandle is a fresh file of the
 * exporter's own: a symlink planted at its (predictable) name never makes the export write
 * through it, and a planted file of the same name is replaced, not trusted. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    char victim[128], link[256];
    snprintf(victim, sizeof victim, "/tmp/hetmem-acl-victim.%d", (int)getpid());
    FILE *f = fopen(victim, "w");
    CHECK(f != NULL);
    fputs("IMPORTANT DATA\n", f);
    fclose(f);
    /* The temporary name of the first export of this process. */
    snprintf(link, sizeof link, "/dev/shm/hetmem-acl-shareable.%d.1.tmp", (int)getpid());
    unlink(link);
    CHECK(symlink(victim, link) == 0);

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtPhysicalMemProp p;
    memset(&p, 0, sizeof p);
    p.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    p.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    p.memAttr = ACL_HBM_MEM_HUGE;
    p.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    size_t gran = 0;
    OK(aclrtMemGetAllocationGranularity(&p, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &gran));
    aclrtDrvMemHandle h;
    OK(aclrtMallocPhysical(&h, gran, &p, 0));
    uint64_t sh = 0;
    OK(aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 1, &sh));

    /* The victim is untouched and the link is gone (replaced by nothing: renamed away). */
    char buf[64] = {0};
    f = fopen(victim, "r");
    CHECK(f != NULL);
    CHECK(fgets(buf, sizeof buf, f) != NULL);
    fclose(f);
    CHECK(strcmp(buf, "IMPORTANT DATA\n") == 0);
    struct stat st;
    CHECK(lstat(link, &st) != 0);

    /* The handle still imports in this process. */
    aclrtDrvMemHandle back;
    OK(aclrtMemImportFromShareableHandle(sh, 0, &back));
    OK(aclrtFreePhysical(back));
    OK(aclrtFreePhysical(h));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    unlink(victim);
    printf("share file links ok\n");
    return 0;
}
