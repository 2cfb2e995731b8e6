/* The runtime API (zer*, API 1.14): the table a loader asks the driver for
 * (zerGetGlobalProcAddrTable) and its four functions: zerGetDefaultContext (one default context,
 * the same handle every time, the same as zeDriverGetDefaultContext, usable), the identifier
 * translations (index in zeDeviceGet's list, both ways; failures UINT32_MAX / null with a
 * reason), zerGetLastErrorDescription.
 *
 * Routes: through the loader where the loader exports zer* (it routes them to the driver's
 * table); and always as a loader does it, from the driver itself: dlopen of the library named
 * by ZE_ENABLE_ALT_DRIVERS (the same, already loaded copy the loader uses), its
 * zerGetGlobalProcAddrTable, the functions of the table. Debian's loader 1.8.12 has no zer
 * symbol, so there the second route is the only one; the handles it answers are the loader's
 * (one driver, no intercept: the loader passes the driver's handles through). */
#include "common.h"
#include "ze_hetmem.h"
#include <dlfcn.h>

static void check_table(zer_global_dditable_t *t, env_t *e, ze_context_handle_t want_ctx,
                        const char *route) {
    const char *s = NULL;
    /* zerGetDefaultContext: non-null, the same handle every time, the driver's default */
    ze_context_handle_t c1 = t->pfnGetDefaultContext();
    ze_context_handle_t c2 = t->pfnGetDefaultContext();
    EXPECT(c1 != NULL && c1 == c2);
    EXPECT(c1 == want_ctx);
    /* and it works as a context: a host allocation and a copy on one of its devices */
    OK(zeContextGetStatus(c1));
    void *h = NULL;
    OK(zeMemAllocHost(c1, &HOST_DESC, 4096, 64, &h));
    if (h) {
        memset(h, 0x5a, 4096);
        ze_command_queue_desc_t qd = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                      ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS, ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
        ze_command_list_handle_t l = NULL;
        OK(zeCommandListCreateImmediate(c1, e->dev[0], &qd, &l));
        unsigned char pat = 0xc3;
        OK(zeCommandListAppendMemoryFill(l, h, &pat, 1, 4096, NULL, 0, NULL));
        EXPECT(((unsigned char *)h)[0] == 0xc3 && ((unsigned char *)h)[4095] == 0xc3);
        OK(zeCommandListDestroy(l));
        OK(zeMemFree(c1, h));
    }
    /* identifiers: the index in zeDeviceGet's list, both ways */
    for (uint32_t i = 0; i < e->ndev; i++) {
        EXPECT(t->pfnTranslateDeviceHandleToIdentifier(e->dev[i]) == i);
        EXPECT(t->pfnTranslateIdentifierToDeviceHandle(i) == e->dev[i]);
    }
    /* failures: UINT32_MAX / null, and the reason for zerGetLastErrorDescription */
    EXPECT(t->pfnTranslateDeviceHandleToIdentifier(NULL) == UINT32_MAX);
    s = NULL;
    OK(t->pfnGetLastErrorDescription(&s));
    EXPECT(s != NULL && strstr(s, "null") != NULL);
    EXPECT(t->pfnTranslateDeviceHandleToIdentifier(BOGUS(ze_device_handle_t)) == UINT32_MAX);
    EXPECT(t->pfnTranslateIdentifierToDeviceHandle(e->ndev) == NULL);
    s = NULL;
    OK(t->pfnGetLastErrorDescription(&s));
    EXPECT(s != NULL && strstr(s, "identifier") != NULL);
    EXPECT(t->pfnTranslateIdentifierToDeviceHandle(UINT32_MAX) == NULL);
    CHECK(t->pfnGetLastErrorDescription(NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    /* the same string as the driver's own last-error call (1.6: newer than the 1.4 loader) */
    typedef ze_result_t (*last_error_t)(ze_driver_handle_t, const char **);
    last_error_t driver_last_error = NULL;
    OK(zeDriverGetExtensionFunctionAddress(e->drv, "zeDriverGetLastErrorDescription",
                                           (void **)&driver_last_error));
    CHECK(t->pfnGetLastErrorDescription(NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    const char *s2 = NULL;
    s = NULL;
    OK(t->pfnGetLastErrorDescription(&s));
    if (driver_last_error) OK(driver_last_error(e->drv, &s2));
    EXPECT(s && s2 && strcmp(s, s2) == 0 && strstr(s, "ppString") != NULL);
    printf("zer: %s route checked\n", route);
}

int main(void) {
    const char *path = getenv("ZE_ENABLE_ALT_DRIVERS");
    if (!path || !*path) {
        fprintf(stderr, "FATAL zer.c: ZE_ENABLE_ALT_DRIVERS must name libze_hetmem.so\n");
        return 2;
    }
    void *drv_lib = dlopen(path, RTLD_NOW);
    if (!drv_lib) {
        fprintf(stderr, "FATAL zer.c: dlopen(%s): %s\n", path, dlerror());
        return 2;
    }
    zer_pfnGetGlobalProcAddrTable_t get =
        (zer_pfnGetGlobalProcAddrTable_t)dlsym(drv_lib, "zerGetGlobalProcAddrTable");
    EXPECT(get != NULL);
    if (!get) return finish("zer");
    /* The getter: a null table, a major version other than 1 (nothing written), a version
     * before the table existed (1.13: nothing written), then 1.14: every slot. */
    zer_global_dditable_t t;
    memset(&t, 0, sizeof t);
    CHECK(get(ZE_MAKE_VERSION(1, 14), NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    CHECK(get(ZE_MAKE_VERSION(2, 0), &t), ZE_RESULT_ERROR_UNSUPPORTED_VERSION);
    EXPECT(t.pfnGetDefaultContext == NULL);
    OK(get(ZE_MAKE_VERSION(1, 13), &t));
    EXPECT(t.pfnGetLastErrorDescription == NULL && t.pfnGetDefaultContext == NULL);
    OK(get(ZE_MAKE_VERSION(1, 14), &t));
    EXPECT((void *)t.pfnGetLastErrorDescription == dlsym(drv_lib, "zerGetLastErrorDescription"));
    EXPECT((void *)t.pfnTranslateDeviceHandleToIdentifier ==
           dlsym(drv_lib, "zerTranslateDeviceHandleToIdentifier"));
    EXPECT((void *)t.pfnTranslateIdentifierToDeviceHandle ==
           dlsym(drv_lib, "zerTranslateIdentifierToDeviceHandle"));
    EXPECT((void *)t.pfnGetDefaultContext == dlsym(drv_lib, "zerGetDefaultContext"));
    if (!t.pfnGetDefaultContext || !t.pfnGetLastErrorDescription ||
        !t.pfnTranslateDeviceHandleToIdentifier || !t.pfnTranslateIdentifierToDeviceHandle)
        return finish("zer");

    /* Does the loader route zer*? (loader 1.8.12 has no zer symbol) */
    void *ldr = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
    zer_global_dditable_t lt;
    memset(&lt, 0, sizeof lt);
    if (ldr) {
        lt.pfnGetLastErrorDescription = (zer_pfnGetLastErrorDescription_t)dlsym(ldr, "zerGetLastErrorDescription");
        lt.pfnTranslateDeviceHandleToIdentifier =
            (zer_pfnTranslateDeviceHandleToIdentifier_t)dlsym(ldr, "zerTranslateDeviceHandleToIdentifier");
        lt.pfnTranslateIdentifierToDeviceHandle =
            (zer_pfnTranslateIdentifierToDeviceHandle_t)dlsym(ldr, "zerTranslateIdentifierToDeviceHandle");
        lt.pfnGetDefaultContext = (zer_pfnGetDefaultContext_t)dlsym(ldr, "zerGetDefaultContext");
    }
    int loader_routes = lt.pfnGetDefaultContext && lt.pfnGetLastErrorDescription &&
                        lt.pfnTranslateDeviceHandleToIdentifier && lt.pfnTranslateIdentifierToDeviceHandle;

    /* Before zeInit (only where no loader has initialised the driver behind our back: an old
     * loader that knows no zer): null, with the reason. */
    if (!loader_routes) {
        EXPECT(t.pfnGetDefaultContext() == NULL);
        EXPECT(t.pfnTranslateIdentifierToDeviceHandle(0) == NULL);
        const char *s = NULL;
        OK(t.pfnGetLastErrorDescription(&s));
        EXPECT(s != NULL && strstr(s, "zeInit") != NULL);
    }

    env_t e = setup();
    typedef ze_context_handle_t (*get_default_t)(ze_driver_handle_t);
    get_default_t zeDefault = NULL;
    OK(zeDriverGetExtensionFunctionAddress(e.drv, "zeDriverGetDefaultContext", (void **)&zeDefault));
    ze_context_handle_t want = zeDefault ? zeDefault(e.drv) : NULL;
    EXPECT(want != NULL);
    check_table(&t, &e, want, "driver table (as a loader fetches it)");
    if (loader_routes) {
        check_table(&lt, &e, want, "loader");
    } else {
        printf("zer: this loader has no zer* symbols (Debian's 1.8.12 predates them); "
               "the driver's table was checked as a loader fetches it\n");
    }
    zeContextDestroy(e.ctx);
    return finish("zer");
}
