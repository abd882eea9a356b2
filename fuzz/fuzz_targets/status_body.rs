//! The body of a list's or a watch's error response, read into the `Status` an error is
//! classified by (410 Gone relists, 403 stops, 429 backs off...).
//!
//! Input: one byte (bit 0 set when the response says protobuf; the rest picks the HTTP
//! status), then the body.
//!
//! Checked, beyond not panicking: the status always says something (a code or a reason);
//! a JSON body that is a status saying something is that status, and any other body is a
//! failure of the HTTP status with the body's text; a status read from protobuf means the
//! same written as JSON and read back through the JSON path; what reading holds at once is
//! proportional to the body.

#![no_main]

use kube_core::Status;
use kube_informer::fuzzing::{error_status, open_envelope};
use kube_informer_fuzz::{assert_bounded, peak_allocation};
use libfuzzer_sys::fuzz_target;

const CODES: [u16; 14] = [
    300, 400, 401, 403, 404, 405, 409, 410, 422, 429, 500, 502, 503, 504,
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let protobuf = selector & 1 == 1;
    let code = CODES[usize::from(selector >> 1) % CODES.len()];

    let (status, peak) = peak_allocation(|| error_status(body, protobuf, code));
    assert_bounded("reading", peak, body.len(), 64);
    assert!(
        status.code != 0 || !status.reason.is_empty(),
        "a status that says nothing: {status:?}"
    );

    let says_something = |s: &Status| s.code != 0 || !s.reason.is_empty();
    let fallback = || Status::failure(String::from_utf8_lossy(body).trim(), "").with_code(code);
    if protobuf {
        let from_protobuf = open_envelope(body).is_ok() && status != fallback();
        if from_protobuf {
            let json = serde_json::to_vec(&status).expect("a status writes as JSON");
            let again = error_status(&json, false, code);
            assert_eq!(again, status, "read from protobuf, then through its JSON");
        }
    } else {
        match serde_json::from_slice::<Status>(body) {
            Ok(sent) if says_something(&sent) => assert_eq!(status, sent),
            _ => assert_eq!(status, fallback(), "a body that is no status"),
        }
    }
});
