//! # hetmem-ze: hetmem as a Level Zero driver
//!
//! `libze_hetmem.so` is a Level Zero driver that the **official loader** loads: an unmodified C
//! program compiled against the system `ze_api.h` and linked with `-lze_loader` runs on hetmem
//! (host backend: any Linux machine, no accelerator) with
//!
//! ```text
//! ZE_ENABLE_ALT_DRIVERS=/abs/path/to/libze_hetmem.so ./program
//! ```
//!
//! The library also exports the whole `ze*` API under its own names, so a program can link it
//! directly (`-lze_hetmem`) and reach every call, including those the installed loader and
//! header are too old to know (`include/ze_hetmem.h` declares them).
//!
//! The crate only translates: handles, descriptors and `pNext` chains in, `ze_result_t` out,
//! over hetmem's safe Rust API ([`hetmem::Context`] and friends), where every spec rule lives.
//! `HETMEM_BACKEND` and `HETMEM_HOST_*` choose the backend and the host devices, as for the
//! Rust API ([`hetmem::Runtime::from_env`], read at `zeInit` / `zeInitDrivers`).
//!
//! # How the loader finds and drives this library (read from `oneapi-src/level-zero`, `source/loader/`)
//! - **Discovery** (`linux/driver_discovery_lin.cpp`, `discoverEnabledDrivers`): without
//!   `ZE_ENABLE_ALT_DRIVERS` the loader looks for the known names (`libze_intel_gpu.so.1`,
//!   `libze_intel_vpu.so.1`, …) in the library search paths. With it, the variable's
//!   comma-separated entries replace that list and each is `dlopen`ed as given: an absolute
//!   path to `libze_hetmem.so` loads this library and nothing else.
//! - **DDI tables** (`ze_ldrddi.cpp`: `zeloaderInitDriverDDITables` and the exported
//!   `zeGet*ProcAddrTable`): the loader `dlsym`s `zeGet<Table>ProcAddrTable` in the driver and
//!   calls it with the **API version the application's side asked for** (the loader's
//!   `ddi_init_version`; loader 1.8.12's `ze_lib` asks `ZE_API_VERSION_CURRENT` = 1.4, recent
//!   loaders up to 1.17). Required tables (a getter that returns an error gets the driver
//!   rejected): Global, Driver, Device, Context, CommandQueue, CommandList, Event, EventPool,
//!   Fence, Image, Kernel, Mem, Module, ModuleBuildLog, PhysicalMem, Sampler, VirtualMem.
//!   Optional (a failure is ignored): DriverExp, DeviceExp, CommandListExp, EventExp, ImageExp,
//!   KernelExp, MemExp, FabricVertexExp, FabricEdgeExp, RTASBuilder(Exp),
//!   RTASParallelOperation(Exp); recent loaders also ask Graph / ExecutableGraph (1.17). Loader
//!   1.8.12 (`strings libze_loader.so.1.8.0`) looks up exactly the 23 `ze` getters of its
//!   `ze_ddi.h`. With one driver and no `ZE_ENABLE_LOADER_INTERCEPT`, the loader hands the
//!   driver's table entries to the application unchanged, so the application calls this
//!   library directly; handles pass through untouched (with several drivers the loader wraps
//!   them). This library exports every `ze` getter ([`ddi`]) and every `zes` / `zet`
//!   getter of the 1.4 and 1.12 headers ([`ddi::TOOL_TABLES`]; every slot answers
//!   `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`): found by experiment, loader 1.8.12's `zeInit`
//!   answers `ZE_RESULT_ERROR_UNINITIALIZED` **without ever calling the driver's `zeInit`**
//!   when the driver lacks them: without the `zes` getters, and (separately) without the `zet`
//!   getters, `zeInit` fails so (presumably its `ze_lib` also initialises the sysman and tools
//!   tables and gives up when no driver provides them). The runtime table (`zer`, API 1.14:
//!   `zerGetGlobalProcAddrTable`, [`zer`]) is exported too: loaders that route `zer*` through
//!   drivers treat it as optional, and the reference driver's sample programs stop when
//!   `zerGetDefaultContext` answers null.
//! - **Versions**: each getter writes only the slots that exist in the asked version's table
//!   (slots are appended in version order, so that is a prefix; see [`ddi`]), never past it.
//! - **Init**: `zeInit(flags)` reaches the driver through the Global table's `pfnInit` (the
//!   loader calls it for each driver; a failure drops that driver); then `zeDriverGet` goes to
//!   `pfnGet` of the Driver table (recent loaders also call `zeDriverGetProperties`,
//!   `zeDeviceGet`, `zeDeviceGetProperties` to sort drivers by device type, and
//!   `zeDriverGetExtensionProperties`). `zeInitDrivers(pCount, phDrivers, desc)` (API 1.10)
//!   reaches `pfnInitDrivers` of the Global table, first with a null array to count; a loader
//!   uses it only if the driver's Global table (asked at 1.10 or later) fills that slot.
//! - **Checked against** the installed Debian bookworm loader 1.8.12 (API 1.4 headers, with
//!   its validation layer `libze_validation_layer.so.1`), by the C suite of `tests/c/ze/`; the
//!   layouts and every DDI slot also against Debian trixie's 1.12 headers (`libze-dev` 1.20.6:
//!   `HETMEM_ZE_EXTRA_HEADERS=<dir>`, 192 slots). Trixie's loader itself needs glibc 2.38 and
//!   could not run on bookworm; loaders newer than 1.8.12 were read, not run.
//!
//! # Handles
//! Opaque numbers, validated on every call ([`rt`]): a null, unknown, destroyed or wrong-kind
//! handle is `ZE_RESULT_ERROR_INVALID_NULL_HANDLE`, never a crash. This holds where the loader
//! passes handles through (one driver, the default). In the loader's intercept mode (several
//! drivers, or `ZE_ENABLE_LOADER_INTERCEPT=1`) the loader wraps handles in its own objects and
//! dereferences them itself: a made-up handle then crashes loader 1.8.12 before any driver sees
//! it (checked: `driver.c` under intercept), and functions obtained with
//! `zeDriverGetExtensionFunctionAddress` receive the loader's wrapped handles (answered
//! `INVALID_NULL_HANDLE`; the application must translate them with `zelLoaderTranslateHandle`).
//! `tests/c/ze/intercept.c` runs the main flows in intercept mode (with translated handles for
//! the extension functions). No panic crosses the C ABI
//! (each entry point runs in [`rt::guard`]: `ZE_RESULT_ERROR_UNKNOWN`).
//!
//! # Implemented functions
//! Driver: `zeInit`, `zeInitDrivers`, `zeDriverGet`, `zeDriverGetApiVersion` (1.18),
//! `zeDriverGetProperties` (fills a chained `ze_driver_memory_free_ext_properties_t`),
//! `zeDriverGetIpcProperties`, `zeDriverGetExtensionProperties` (the 7 extensions of
//! [`api::EXTENSIONS`], each 1.0), `zeDriverGetExtensionFunctionAddress` (every implemented
//! function, by name), `zeDriverGetLastErrorDescription`, `zeDriverGetDefaultContext`.
//! Device: `zeDeviceGet`, `zeDeviceGetSubDevices` (the host backend's configured
//! sub-devices, see Decisions), `zeDeviceGetRootDevice`,
//! `zeDeviceGetProperties`, `zeDeviceGetComputeProperties`, `zeDeviceGetModuleProperties`,
//! `zeDeviceGetCommandQueueGroupProperties`, `zeDeviceGetMemoryProperties` (fills a chained
//! `ze_device_memory_ext_properties_t`, see Decisions),
//! `zeDeviceGetMemoryAccessProperties`, `zeDeviceGetCacheProperties` (none),
//! `zeDeviceGetImageProperties` (no images), `zeDeviceGetExternalMemoryProperties`,
//! `zeDeviceGetP2PProperties`, `zeDeviceCanAccessPeer`, `zeDeviceGetStatus`,
//! `zeDeviceGetGlobalTimestamps`.
//! Context: `zeContextCreate`, `zeContextCreateEx`, `zeContextDestroy`, `zeContextGetStatus`,
//! `zeContextSystemBarrier`, `zeContextMakeMemoryResident`, `zeContextEvictMemory`.
//! Memory: `zeMemAllocHost` / `Device` / `Shared` (chained: relaxed limits EXT and EXP,
//! compression hints, system-memory import on host, IPC handle type on host and device),
//! `zeMemFree`, `zeMemFreeExt`, `zeMemGetAllocProperties`, `zeMemGetAddressRange`,
//! `zeMemGetIpcHandle`, `zeMemGetIpcHandleWithProperties` (handle-type and range
//! descriptors), `zeMemOpenIpcHandle`, `zeMemCloseIpcHandle`, `zeMemPutIpcHandle`,
//! `zeMemGetIpcHandleFromFileDescriptorExp`, `zeMemGetFileDescriptorFromIpcHandleExp`.
//! Virtual and physical memory: `zeVirtualMemReserve`, `zeVirtualMemFree`,
//! `zeVirtualMemQueryPageSize`, `zeVirtualMemMap`, `zeVirtualMemUnmap`,
//! `zeVirtualMemSetAccessAttribute`, `zeVirtualMemGetAccessAttribute`, `zePhysicalMemCreate`
//! (chained IPC handle type), `zePhysicalMemDestroy`, `zePhysicalMemGetProperties`.
//! Queues and lists: `zeCommandQueueCreate`, `zeCommandQueueDestroy`,
//! `zeCommandQueueExecuteCommandLists`, `zeCommandQueueSynchronize`, `zeCommandListCreate`,
//! `zeCommandListCreateImmediate`, `zeCommandListDestroy`, `zeCommandListClose`,
//! `zeCommandListReset`, `zeCommandListHostSynchronize`, `zeCommandListAppendMemoryCopy`,
//! `zeCommandListAppendMemoryFill`, `zeCommandListAppendBarrier`,
//! `zeCommandListAppendMemoryRangesBarrier`, `zeCommandListAppendSignalEvent`,
//! `zeCommandListAppendWaitOnEvents`, `zeCommandListAppendMemoryPrefetch` and
//! `zeCommandListAppendMemAdvise` (hints: checked, no effect).
//! Events and fences: `zeEventPoolCreate`, `zeEventPoolDestroy`, `zeEventCreate`,
//! `zeEventDestroy`, `zeEventHostSignal`, `zeEventHostSynchronize`, `zeEventQueryStatus`,
//! `zeEventHostReset`, `zeFenceCreate`, `zeFenceDestroy`, `zeFenceHostSynchronize`,
//! `zeFenceQueryStatus`, `zeFenceReset`.
//! Runtime (`zer`, [`zer`]): `zerGetDefaultContext`, `zerGetLastErrorDescription`,
//! `zerTranslateDeviceHandleToIdentifier`, `zerTranslateIdentifierToDeviceHandle`.
//!
//! # Answered `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`
//! Every other slot of every table, listed in [`ddi::UNSUPPORTED`]: modules, kernels, images,
//! samplers, ray tracing, fabric, graphs, mutable and cloned command lists, event-pool IPC,
//! counter-based events, kernel timestamps, external semaphores, region / cross-context
//! copies, `zeCommandListAppendEventReset`, `zeCommandListAppendWriteGlobalTimestamp`, the
//! 1.9+ getters of queues / lists / events / pools, atomic access attributes, cache
//! reservation, PCI properties, runtime requirements, `zeDeviceSynchronize`,
//! `zeMemGetPitchFor2dImage`, `zeContextMakeImageResident`, `zeContextEvictImage`.
//!
//! # Decisions
//! - Devices are `ZE_DEVICE_TYPE_GPU` with `ZE_DEVICE_PROPERTY_FLAG_INTEGRATED` (their memory
//!   is host RAM), so programs that look for a GPU find them; `zeInit(VPU_ONLY)` and
//!   `zeInitDrivers` without the GPU flag find no driver.
//! - A chained structure a call does not take is `ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION`
//!   naming its stype (the reference driver's answer).
//! - Chained **output** structures (properties) are filled where hetmem can answer them
//!   truthfully and every other one is left as the program wrote it (the chain is walked,
//!   unknown stypes skipped): `ze_driver_memory_free_ext_properties_t` (driver),
//!   `ze_device_readonly_memory_ext_properties_t` (device: ENFORCED, case 2), and
//!   `ze_device_memory_ext_properties_t` (memory: `physicalSize` = the capacity, design
//!   bandwidths 0 with `ZE_BANDWIDTH_UNIT_UNKNOWN`, `type` untouched, since the kind of the
//!   memory behind a device is not known here). Not filled: the LUID and IP-version
//!   extensions (no such identity exists for these devices), and
//!   `ze_device_usablemem_size_ext_properties_t` (API 1.15): its stype's value was in none of
//!   the published headers or spec sources reachable here, and a guessed stype could land on
//!   another structure.
//! - The v1.18 range descriptor's stype is **provisional**: 0x00020049
//!   ([`types::ZE_STRUCTURE_TYPE_IPC_PHYS_MEM_HANDLE_RANGE_EXT_DESC`], one place; C:
//!   `include/ze_hetmem.h`). `ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY` is taken as `ZE_BIT(4)`
//!   (inferred, see [`types::ZE_HOST_MEM_ALLOC_FLAG_MEM_READ_ONLY`]).
//! - Destroying a context, pool or queue also destroys what was made from it (their handles
//!   become invalid), so the context's memory is released.
//! - `ZE_FENCE_FLAG_SIGNALED` makes a fence that is signalled until `zeFenceReset`
//!   (`hetmem::CommandQueue::create_fence(true)`).
//! - Every rule of a descriptor or flag field is hetmem's, reached through its decoders
//!   (`hetmem::FlagSet`, `CommandQueueDesc`, `CommandListDesc`, `MemoryAdvice`,
//!   `Context::create_event_pool` / `EventPool::create_event`, `AllocDesc::system_memory_sized`,
//!   `Context::physical_memory_properties`), so Rust and C callers get the same answer.
//! - Objects of one context: executing a command list of another context on a queue, or
//!   appending an event of another context to a list (signal or wait), is
//!   `ZE_RESULT_ERROR_INVALID_ARGUMENT` (the header requires one context but names no code).
//! - The IPC handle-type descriptor is taken where the extension defines it (device and host
//!   allocations, physical memory, get-with-properties); chained on a shared allocation it is
//!   `ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION`. `ZE_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE`
//!   is supported on both backends within one machine (case 11 of
//!   `shared/cases/level-zero.md`, `tests/c/ze/cases_ipc11.c`; the rules are
//!   `hetmem::semantics::ipc::handle_types`): such a handle is opened by another process of
//!   the machine exactly as a default one. The spec publishes no `ze_ipc_property_flag_t` for
//!   fabric handles, so `zeDriverGetIpcProperties` answers `ZE_IPC_PROPERTY_FLAG_MEMORY` alone;
//!   the support is reported by the extension `ZE_extension_ipc_mem_handle_type` in
//!   `zeDriverGetExtensionProperties` and by the types being accepted.
//! - `zeMemGetIpcHandleFromFileDescriptorExp` of an fd received alone from the exporting
//!   process (case 5 of `shared/cases/level-zero.md`, `tests/c/ze/cases_ipc5.c`) gives a
//!   handle that opens the exporter's memory on both backends (cuda: the fd is the export's
//!   description, a sealed memfd holding the handle). `zeMemPutIpcHandle` of such a handle in
//!   the importer is `ZE_RESULT_SUCCESS` and changes nothing: it holds nothing there (the
//!   reference driver answers `SUCCESS` for a handle that is not one of its exports; the
//!   header lists no code). Bytes that are not a hetmem handle, and a put beyond the gets of
//!   a real export, stay `ZE_RESULT_ERROR_INVALID_ARGUMENT`.
//! - With the system-memory descriptor, `zeMemAllocHost`'s `size` must equal the descriptor's
//!   (else `ZE_RESULT_ERROR_INVALID_ARGUMENT`); the alignment is not used (the import keeps the
//!   address).
//! - **Sub-devices** (case 12 of `shared/cases/level-zero.md`, `tests/c/ze/cases_subdevices.c`):
//!   with `HETMEM_HOST_SUBDEVICES=N` (host backend; 0, the default, or 2 to 16) each device has
//!   `N` sub-devices (`zeDeviceGetSubDevices`, the same handles every call; not in
//!   `zeDeviceGet`'s list, and without a `zer` identifier). A sub-device's
//!   `ze_device_properties_t` has `ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE`, its `subdeviceId`, its
//!   root's type and device id, a uuid of its own, and `maxMemAllocSize` at most its share;
//!   its memory (`zeDeviceGetMemoryProperties`) is its share of the root's capacity
//!   (capacity / `N`, rounded down to 2 MiB); it has the root's queue group, and its queues and
//!   lists are its own. Memory made on it counts against its share and its root; memory made
//!   on the root against the root alone (the model is `hetmem::semantics::capacity`'s).
//!   `zeDeviceGetRootDevice` answers the root for a sub-device and null for a root (which
//!   belongs to no root). `zeMemGetAllocProperties` answers the sub-device a USM allocation
//!   was made on (for a mapped page of physical memory, its root). On the cuda backend there
//!   are none: a GPU is one device, and a MIG instance is a separate CUDA device, not a
//!   sub-device (`hetmem info` says so).
//! - The context of `zeDriverGetDefaultContext` is made on first use and is an ordinary context:
//!   destroying it makes its handle invalid for good.
//! - Queue descriptors: one queue group (ordinal 0) of 64 queues, each with its own engine;
//!   `ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS` (queues and immediate lists) waits for the work before
//!   returning.
//! - **The reference driver's answers where the header's error list differs** (deliberate:
//!   programs written for Level Zero follow Intel's compute-runtime; the rules live in
//!   `hetmem::semantics::vmm`; cases 3 and 4 of `shared/cases/level-zero.md`, checked by
//!   `tests/c/ze/cases_vm.c`):
//!   - `zeVirtualMemQueryPageSize` with `size` 0 is `ZE_RESULT_SUCCESS` and answers the page
//!     size of the smallest allocation (that of size 1: 64 KiB on the host backend, 2 MiB on
//!     CUDA). The header's answer is `ZE_RESULT_ERROR_UNSUPPORTED_SIZE` (`0 == size`); the
//!     loader's validation layer gives that answer itself, before the driver is called.
//!   - `zeVirtualMemUnmap` of a page-aligned range inside one reservation that is already
//!     unmapped, or was never mapped, is `ZE_RESULT_SUCCESS` and changes nothing; of a partly
//!     mapped range it unmaps the mapped pages. The header asks for a mapped range (its answer:
//!     `ZE_RESULT_ERROR_INVALID_ARGUMENT`); a range outside every reservation of the context,
//!     or across two, stays `ZE_RESULT_ERROR_INVALID_ARGUMENT`.
//! - Under the loader's 1.4 validation layer, what 1.4 did not allow is refused by the layer
//!   before it reaches this driver: a null start hint of `zeVirtualMemReserve`,
//!   `ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST` and a null device of `zePhysicalMemCreate`, host
//!   allocation flags past bit 3 (the C suite expects the layer's answers in that pass).

pub mod api;
pub mod ddi;
pub mod layout;
pub mod rt;
pub mod types;
pub mod zer;
