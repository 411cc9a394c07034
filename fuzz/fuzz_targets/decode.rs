//! Fuzzes `cdc::Decoder::decode` with arbitrary keys and values: it must never panic.
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode` (cargo-fuzz needs
//! nightly features; RUSTC_BOOTSTRAP lets the stable toolchain provide them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_sidecar::cdc::{Decision, Decoder, Record};

fuzz_target!(|data: &[u8]| {
    // The first byte chooses which of key/value are present and where the
    // split between them falls, so one input reaches every combination.
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let split = usize::from(control >> 2).min(rest.len());
    let (key, value) = rest.split_at(split);
    let record = Record {
        topic: "outbox.public.outbox_events",
        partition: 0,
        offset: 0,
        key: (control & 1 == 1).then_some(key),
        value: (control & 2 == 2).then_some(value),
    };
    let decision = Decoder::new("outbox_events").decode(&record);
    if let Decision::Invalid(invalid) = &decision {
        assert_eq!(invalid.topic, record.topic);
    }
    let _ = decision.result_label();
});
