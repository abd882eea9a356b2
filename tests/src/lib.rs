//! End-to-end tests of kube-informer and kube-testenv against a real control
//! plane; the tests themselves live in `tests/`.
