//! ACL IPC keys through the Rust API (`Context::acl_ipc_export_key`,
//! `Driver::acl_ipc_set_import_pids`, `Context::acl_ipc_import_key`, `Driver::acl_ipc_close_key`,
//! `Context::acl_ipc_forget_keys`): the rules of `semantics::acl::ipc_key` as a Rust caller
//! meets them (the C library's `aclrtIpcMem*` calls translate to these; `tests/c/acl` checks
//! them across processes), and the one pid whitelist every ACL import follows
//! (`hetmem::acl::check_import_pid`).

mod common;

use hetmem::acl::{check_import_pid, own_pid, KEY_LEN};
use hetmem::{AllocDesc, Error, Runtime};

fn rt() -> Runtime {
    common::builder()
        .host_devices(1)
        .host_device_memory(64 << 20)
        .build()
        .unwrap()
}

/// `n` bytes at `src` (device memory or a view), through the host-synchronous copy.
fn read(ctx: &hetmem::Context, src: usize, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    // SAFETY: `b` is ours and `n` bytes long; nothing else references it during the call.
    unsafe { ctx.host_memcpy(b.as_mut_ptr() as usize, src, n) }.unwrap();
    b
}

#[test]
fn a_key_opens_the_exporters_bytes_once_per_process_and_stops_working_after_close() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let drv = rt.driver();
    let dev = drv.device(0).unwrap();
    let a = drv.create_context().unwrap();
    let b = drv.create_context().unwrap();
    let size = a.query_page_size(&dev, 1 << 20).unwrap();
    let p = a.alloc_device(&dev, &AllocDesc::new(size)).unwrap();
    // SAFETY: `p` is device memory of `a`, `size` bytes, unused elsewhere.
    unsafe { a.host_memset(p, 0x5a, size) }.unwrap();
    let before = drv.ipc_stats();

    let key = a.acl_ipc_export_key(p, size, 0, KEY_LEN).unwrap();
    assert!(
        key.starts_with(&format!("hmipc.{}.", own_pid())) && key.len() < KEY_LEN,
        "{key}"
    );
    assert_eq!(drv.ipc_stats().exports, before.exports + 1);
    // The exporter itself is on no pid list and may import.
    let v = b.acl_ipc_import_key(&key, 0).unwrap();
    assert_eq!(read(&b, v, 64), vec![0x5a; 64]);
    // SAFETY: the view maps `a`'s bytes; the write goes to them.
    unsafe { b.host_memset(v, 0x21, 64) }.unwrap();
    assert_eq!(read(&a, p, 64), vec![0x21; 64]);
    // One view per key and process.
    let e = b.acl_ipc_import_key(&key, 0).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("already imported")),
        "{e:?}"
    );
    drv.acl_ipc_set_import_pids(&key, &[1, 2]).unwrap();
    assert!(matches!(
        drv.acl_ipc_set_import_pids(&key, &[]),
        Err(Error::InvalidSize(_))
    ));

    // In the process that both exported and imported, the first close closes the view, the
    // second ends the export; then the key is dead.
    drv.acl_ipc_close_key(&key).unwrap();
    assert_eq!(drv.ipc_stats().views, before.views);
    drv.acl_ipc_close_key(&key).unwrap();
    assert_eq!(drv.ipc_stats().exports, before.exports);
    let e = b.acl_ipc_import_key(&key, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(matches!(
        drv.acl_ipc_close_key(&key),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        drv.acl_ipc_set_import_pids(&key, &[1]),
        Err(Error::InvalidArgument(_))
    ));
    a.free_memory(p).unwrap();
}

/// Whether an error is of the expected kind.
type Kind = fn(&Error) -> bool;

#[test]
fn a_refused_export_or_import_changes_nothing_and_names_the_bad_value() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let drv = rt.driver();
    let dev = drv.device(0).unwrap();
    let a = drv.create_context().unwrap();
    let size = a.query_page_size(&dev, 1 << 20).unwrap();
    let p = a.alloc_device(&dev, &AllocDesc::new(size)).unwrap();
    let h = a.alloc_host(&AllocDesc::new(size)).unwrap();
    let before = drv.ipc_stats();
    let cases: Vec<(&str, hetmem::Result<String>, Kind, &str)> = vec![
        (
            "size 0",
            a.acl_ipc_export_key(p, 0, 0, KEY_LEN),
            |e| matches!(e, Error::InvalidSize(_)),
            "size",
        ),
        (
            "flags 2",
            a.acl_ipc_export_key(p, size, 2, KEY_LEN),
            |e| matches!(e, Error::InvalidEnumeration(_)),
            "0x2",
        ),
        (
            "len 4",
            a.acl_ipc_export_key(p, size, 0, 4),
            |e| matches!(e, Error::InvalidSize(_)),
            "len 4",
        ),
        (
            "past the end",
            a.acl_ipc_export_key(p, size + 1, 0, KEY_LEN),
            |e| matches!(e, Error::InvalidArgument(_)),
            "past the end",
        ),
        (
            "not the start",
            a.acl_ipc_export_key(p + 4096, 64, 0, KEY_LEN),
            |e| matches!(e, Error::InvalidArgument(_)),
            "not the start",
        ),
        (
            "host memory",
            a.acl_ipc_export_key(h, 64, 0, KEY_LEN),
            |e| matches!(e, Error::InvalidArgument(_)),
            "Host",
        ),
    ];
    for (what, r, ok, names) in cases {
        let e = r.expect_err(what);
        assert!(ok(&e), "{what}: {e:?}");
        assert!(e.to_string().contains(names), "{what}: {e}");
    }
    assert_eq!(
        drv.ipc_stats().exports,
        before.exports,
        "a refused export made one"
    );
    for bad in ["", "hmipc.", "hmipc.1", "hmipc.x.1", "other.1.2"] {
        let e = a.acl_ipc_import_key(bad, 0).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("not a key")),
            "{bad:?}: {e:?}"
        );
    }
    assert!(matches!(
        a.acl_ipc_import_key("hmipc.1.1", 2),
        Err(Error::InvalidEnumeration(_))
    ));
    assert_eq!(
        drv.ipc_stats().views,
        before.views,
        "a refused import opened one"
    );
    a.free_memory(p).unwrap();
    a.free_memory(h).unwrap();
}

#[test]
fn forgetting_a_contexts_keys_ends_its_exports_and_closes_its_views() {
    if common::skip() {
        return;
    }
    let rt = rt();
    let drv = rt.driver();
    let dev = drv.device(0).unwrap();
    let a = drv.create_context().unwrap();
    let b = drv.create_context().unwrap();
    let size = a.query_page_size(&dev, 1 << 20).unwrap();
    let p = a.alloc_device(&dev, &AllocDesc::new(size)).unwrap();
    let before = drv.ipc_stats();
    let key = a.acl_ipc_export_key(p, size, 1, KEY_LEN).unwrap();
    b.acl_ipc_import_key(&key, 1).unwrap();
    b.acl_ipc_forget_keys();
    assert_eq!(drv.ipc_stats().views, before.views);
    a.acl_ipc_forget_keys();
    assert_eq!(drv.ipc_stats().exports, before.exports);
    assert!(matches!(
        b.acl_ipc_import_key(&key, 0),
        Err(Error::InvalidArgument(_))
    ));
    a.free_memory(p).unwrap();
}

#[test]
fn one_pid_whitelist_admits_the_exporter_a_listed_process_or_anyone_without_validation() {
    assert!(check_import_pid(7, 7, &[], false, "k").is_ok());
    assert!(check_import_pid(7, 9, &[3, 9], false, "k").is_ok());
    assert!(check_import_pid(7, 9, &[], true, "k").is_ok());
    let e = check_import_pid(7, 9, &[3], false, "key \"hmipc.7.1\"").unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("pid list") && m.contains("process 9") && m.contains("hmipc.7.1")),
        "{e:?}"
    );
}
