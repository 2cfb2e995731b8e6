/* The eight range attributes over mixed ranges (advised in part, prefetched in part,
 * read-mostly in part), every dataSize rule, GetAttrs, and the advice / prefetch argument
 * errors, through the C library. Pages are 2 MiB; the allocation has four:
 *   page 0: read-mostly, prefers device 0, accessed by devices 0 and 1, prefetched to device 1
 *   page 1: read-mostly, prefers device 0, accessed by devices 0, 1 and the host, prefetched
 *           to device 1
 *   page 2: prefers the host, prefetched to the host
 *   page 3: prefers NUMA node 0, never prefetched
 * With one device, device 0 stands in for device 1 (the second accessor and the prefetch
 * target) and the program says which checks lose their second device. */
#include <stdint.h>

#include "check.h"

#define PG (2 * MIB)
#define A(name) ACL_MEM_RANGE_ATTRIBUTE_##name

static void expect3(const char *m, size_t off, size_t size, aclrtMemManagedRangeAttribute a,
                    int32_t want) {
    int32_t got = attr_i32(a, m + off, size);
    if (got != want)
        FAILF("attribute %d over [+%#zx, +%#zx) is %d, expected %d", (int)a, off, off + size,
              got, want);
}

/* The first `nwant` of `slots` ids are `want` in any order (each once); the rest are -2. */
static void expect_ids(const int32_t *got, int slots, const int32_t *want, int nwant,
                       const char *what) {
    for (int i = 0; i < nwant; i++) {
        int seen = 0;
        for (int k = 0; k < nwant; k++) seen += got[k] == want[i];
        if (seen != 1) FAILF("%s: id %d is in the first %d slots %d times", what, want[i], nwant, seen);
    }
    for (int k = nwant; k < slots; k++)
        if (got[k] != -2) FAILF("%s: slot %d is %d, expected -2", what, k, got[k]);
}

int main(void) {
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    uint32_t ndev = device_count();
    /* The second device: 1, or 0 where there is only one. */
    const int32_t o = ndev >= 2 ? 1 : 0;
    aclrtStream s = NULL;
    OK(aclrtCreateStream(&s));
    char *m = managed_or_skip(4 * PG);
    if (ndev < 2)
        NA_PART("ACCESSED_BY of two devices and a prefetch to a device other than the current one",
                "only %u device (needs 2); device 0 stands in for device 1", ndev);
    const aclrtMemManagedLocation host = loc(ACL_MEM_LOCATIONTYPE_HOST, 0);
    const aclrtMemManagedLocation dev0 = loc(ACL_MEM_LOCATIONTYPE_DEVICE, 0);
    const aclrtMemManagedLocation dev1 = loc(ACL_MEM_LOCATIONTYPE_DEVICE, o);
    /* The ids of ACCESSED_BY over pages 0-1 and over page 1 (device 0 and the second device,
     * once each; the host is -1). */
    const int32_t two_ids[2] = {0, 1}, three_ids[3] = {0, 1, -1}, one_host[2] = {0, -1};
    const int32_t *acc01 = two_ids, *acc1 = o ? three_ids : one_host;
    const int nacc01 = o ? 2 : 1, nacc1 = o ? 3 : 2;

    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_SET_READ_MOSTLY, host));
    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0));
    OK(aclrtMemManagedAdvise(m + 2 * PG, PG, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    OK(aclrtMemManagedAdvise(m + 3 * PG, PG, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION,
                             loc(ACL_MEM_LOCATIONTYPE_HOST_NUMA, 0)));
    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev1));
    OK(aclrtMemManagedAdvise(m + PG, PG, ACL_MEM_ADVISE_SET_ACCESSED_BY, host));
    OK(aclrtMemManagedPrefetchAsync(m, 2 * PG, dev1, 0, s));
    OK(aclrtMemManagedPrefetchAsync(m + 2 * PG, PG, host, 0, s));
    /* LAST_PREFETCH_LOCATION records the request, not completion: no synchronize yet. */
    expect3(m, 0, 2 * PG, A(LAST_PREFETCH_LOCATION), o);
    OK(aclrtSynchronizeStream(s));

    /* READ_MOSTLY: 1 only if every page is. */
    expect3(m, 0, 2 * PG, A(READ_MOSTLY), 1);
    expect3(m, PG + 12345, 100, A(READ_MOSTLY), 1); /* no alignment rule for queries */
    expect3(m, 0, 4 * PG, A(READ_MOSTLY), 0);
    expect3(m, PG, 2 * PG, A(READ_MOSTLY), 0);

    /* PREFERRED_LOCATION / _TYPE / _ID. */
    expect3(m, 0, 2 * PG, A(PREFERRED_LOCATION), 0);
    expect3(m, 0, 2 * PG, A(PREFERRED_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_DEVICE);
    expect3(m, 0, 2 * PG, A(PREFERRED_LOCATION_ID), 0);
    expect3(m, 2 * PG, PG, A(PREFERRED_LOCATION), -1);
    expect3(m, 2 * PG, PG, A(PREFERRED_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_HOST);
    expect3(m, 2 * PG, PG, A(PREFERRED_LOCATION_ID), -2);
    expect3(m, 3 * PG, PG, A(PREFERRED_LOCATION), 0);
    expect3(m, 3 * PG, PG, A(PREFERRED_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_HOST_NUMA);
    expect3(m, 3 * PG, PG, A(PREFERRED_LOCATION_ID), 0);
    expect3(m, 0, 4 * PG, A(PREFERRED_LOCATION), -2);
    expect3(m, 0, 4 * PG, A(PREFERRED_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_INVALID);
    expect3(m, 0, 4 * PG, A(PREFERRED_LOCATION_ID), -2);
    expect3(m, PG, 2 * PG, A(PREFERRED_LOCATION), -2); /* device 0 then host */

    /* LAST_PREFETCH_LOCATION / _TYPE / _ID. */
    expect3(m, 0, 2 * PG, A(LAST_PREFETCH_LOCATION), o);
    expect3(m, 0, 2 * PG, A(LAST_PREFETCH_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_DEVICE);
    expect3(m, 0, 2 * PG, A(LAST_PREFETCH_LOCATION_ID), o);
    expect3(m, 2 * PG, PG, A(LAST_PREFETCH_LOCATION), -1);
    expect3(m, 2 * PG, PG, A(LAST_PREFETCH_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_HOST);
    expect3(m, 2 * PG, PG, A(LAST_PREFETCH_LOCATION_ID), -2);
    expect3(m, 3 * PG, PG, A(LAST_PREFETCH_LOCATION), -2);
    expect3(m, 3 * PG, PG, A(LAST_PREFETCH_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_INVALID);
    expect3(m, 0, 4 * PG, A(LAST_PREFETCH_LOCATION), -2);
    expect3(m, 0, 4 * PG, A(LAST_PREFETCH_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_INVALID);
    expect3(m, 0, 4 * PG, A(LAST_PREFETCH_LOCATION_ID), -2);

    /* ACCESSED_BY: the ids every page of the range has; extra slots -2; a short buffer gets
     * as many as fit. */
    int32_t by[4] = {9, 9, 9, 9};
    OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, 2 * PG, by, sizeof by));
    expect_ids(by, 4, acc01, nacc01, "ACCESSED_BY of pages 0-1");
    int32_t three[4] = {9, 9, 9, 9};
    OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m + PG, PG, three, sizeof three));
    expect_ids(three, 4, acc1, nacc1, "ACCESSED_BY of page 1");
    int32_t one[2] = {9, 9};
    OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, 2 * PG, one, 4));
    CHECK(one[0] == 0 || one[0] == o);
    CHECK_EQ(one[1], 9); /* only dataSize bytes written */
    OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, 4 * PG, by, sizeof by));
    for (int i = 0; i < 4; i++) CHECK_EQ(by[i], -2); /* pages 2, 3 have none */

    /* Every dataSize rule: 4 for the seven scalar attributes, a non-zero multiple of 4 for
     * ACCESSED_BY; anything else 107000 with nothing written. */
    for (int a = 1; a <= 8; a++) {
        int32_t buf[4] = {0x55, 0x55, 0x55, 0x55};
        const size_t bad_scalar[] = {0, 1, 2, 3, 5, 8, 16};
        const size_t bad_list[] = {0, 1, 2, 3, 5, 6, 7, 9};
        const size_t *bad = a == 3 ? bad_list : bad_scalar;
        size_t nbad = a == 3 ? 8 : 7;
        for (size_t i = 0; i < nbad; i++) {
            EXPECT_CODE(aclrtMemManagedGetAttr((aclrtMemManagedRangeAttribute)a, m, PG, buf, bad[i]),
                        ACL_ERROR_RT_PARAM_INVALID);
            MSG_HAS("dataSize");
            for (int k = 0; k < 4; k++) CHECK_EQ(buf[k], 0x55);
        }
        OK(aclrtMemManagedGetAttr((aclrtMemManagedRangeAttribute)a, m, PG, buf, 4));
        if (a == 3) {
            OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, PG, buf, 8));
            OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, PG, buf, 16));
        }
    }
    CHECK_EQ(sizeof(aclrtMemManagedLocationType), 4);

    /* GetAttrs: all eight at once agree with one at a time; one bad dataSize -> nothing. */
    aclrtMemManagedRangeAttribute all[8];
    int32_t vals[8][2];
    void *ptrs[8];
    size_t sizes[8];
    for (int i = 0; i < 8; i++) {
        all[i] = (aclrtMemManagedRangeAttribute)(i + 1);
        vals[i][0] = vals[i][1] = 0x66;
        ptrs[i] = vals[i];
        sizes[i] = 4;
    }
    OK(aclrtMemManagedGetAttrs(all, 8, m, 2 * PG, ptrs, sizes));
    for (int i = 0; i < 8; i++) {
        if (i == 2) continue; /* ACCESSED_BY's one slot: either id */
        CHECK_EQ(vals[i][0], attr_i32(all[i], m, 2 * PG));
    }
    for (int i = 0; i < 8; i++) vals[i][0] = 0x66;
    sizes[5] = 8;
    EXPECT_CODE(aclrtMemManagedGetAttrs(all, 8, m, 2 * PG, ptrs, sizes), ACL_ERROR_RT_PARAM_INVALID);
    for (int i = 0; i < 8; i++) CHECK_EQ(vals[i][0], 0x66);
    sizes[5] = 4;
    EXPECT_CODE(aclrtMemManagedGetAttrs(all, 0, m, 2 * PG, ptrs, sizes), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedGetAttrs(NULL, 8, m, 2 * PG, ptrs, sizes), ACL_ERROR_INVALID_PARAM);
    ptrs[7] = NULL;
    EXPECT_CODE(aclrtMemManagedGetAttrs(all, 8, m, 2 * PG, ptrs, sizes), ACL_ERROR_INVALID_PARAM);
    MSG_HAS("data[7]");

    /* GetAttr argument errors. */
    int32_t v = 0;
    EXPECT_CODE(aclrtMemManagedGetAttr((aclrtMemManagedRangeAttribute)0, m, PG, &v, 4),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemManagedGetAttr((aclrtMemManagedRangeAttribute)9, m, PG, &v, 4),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("9");
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), m, 0, &v, 4), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), NULL, PG, &v, 4), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), m, PG, NULL, 4), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), m + 3 * PG, 2 * PG, &v, 4),
                ACL_ERROR_RT_PARAM_INVALID); /* runs past the allocation */
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), &v, 4, &v, 4), ACL_ERROR_RT_PARAM_INVALID);

    /* Advice / prefetch argument errors: the code and nothing changed. */
    EXPECT_CODE(aclrtMemManagedAdvise(m + 4096, PG, ACL_MEM_ADVISE_SET_READ_MOSTLY, host),
                ACL_ERROR_RT_ADDR_UNALIGNED);
    EXPECT_CODE(aclrtMemManagedAdvise(m, PG, (aclrtMemManagedAdviseType)6, host),
                ACL_ERROR_RT_PARAM_INVALID);
    MSG_HAS("advice 6");
    EXPECT_CODE(aclrtMemManagedAdvise(m + 2 * PG, PG, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                      loc((aclrtMemManagedLocationType)5, 0)),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemManagedAdvise(m, 0, ACL_MEM_ADVISE_SET_READ_MOSTLY, host),
                ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedAdvise(NULL, PG, ACL_MEM_ADVISE_SET_READ_MOSTLY, host),
                ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedAdvise(m, 5 * PG, ACL_MEM_ADVISE_SET_READ_MOSTLY, host),
                ACL_ERROR_RT_PARAM_INVALID);
    expect3(m, 2 * PG, PG, A(PREFERRED_LOCATION), -1);
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(m, PG, host, 1, s), ACL_ERROR_INVALID_PARAM);
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(m, PG, loc(ACL_MEM_LOCATIONTYPE_INVALID, 0), 0, s),
                ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(m, PG, dev0, 0, (aclrtStream)0x1), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT_CODE(aclrtMemManagedPrefetchAsync(m + 4096, PG, dev0, 0, s), ACL_ERROR_RT_ADDR_UNALIGNED);
    expect3(m, 0, 2 * PG, A(LAST_PREFETCH_LOCATION), o);

    /* UNSET clears what SET recorded. */
    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_UNSET_READ_MOSTLY, loc(ACL_MEM_LOCATIONTYPE_INVALID, 0)));
    expect3(m, 0, PG, A(READ_MOSTLY), 0);
    OK(aclrtMemManagedAdvise(m, 4 * PG, ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION, host));
    expect3(m, 0, 4 * PG, A(PREFERRED_LOCATION_TYPE), ACL_MEM_LOCATIONTYPE_INVALID);
    expect3(m, 2 * PG, PG, A(PREFERRED_LOCATION), -2);
    /* Unset for the second device: device 0 stays (with one device, that was device 0 itself:
     * none stays). */
    OK(aclrtMemManagedAdvise(m, 2 * PG, ACL_MEM_ADVISE_UNSET_ACCESSED_BY, dev1));
    OK(aclrtMemManagedGetAttr(A(ACCESSED_BY), m, 2 * PG, by, sizeof by));
    expect_ids(by, 4, two_ids, o ? 1 : 0, "ACCESSED_BY after unsetting the second device");

    /* Data survives all of it, through host copies. */
    OK(aclrtMemset(m, 4 * PG, 0x3c, 4 * PG));
    unsigned char back[64];
    OK(aclrtMemcpy(back, sizeof back, m + 3 * PG + 5, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    for (size_t i = 0; i < sizeof back; i++) CHECK_EQ(back[i], 0x3c);

    OK(aclrtFree(m));
    EXPECT_CODE(aclrtMemManagedGetAttr(A(READ_MOSTLY), m, PG, &v, 4), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtDestroyStream(s));
    OK(aclFinalize());
    printf("managed attributes ok\n");
    return 0;
}
