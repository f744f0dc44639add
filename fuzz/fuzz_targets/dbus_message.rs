//! D-Bus messages decoded one after another off a byte stream, as the logind watcher reads them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::dbus_message(data));
