//! WebSocket frames read by the streaming server's side of a connection, to its end, within the message cap.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::websocket_frames(data));
