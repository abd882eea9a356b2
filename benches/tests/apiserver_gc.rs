//! The driver's hold on kube-apiserver's garbage collector works on the real server: a
//! collection it asks for is one the server's own count shows.

use benches::apiserver_gc::{collect, collections};
use kube_testenv::TestEnv;

#[tokio::test]
async fn a_collection_asked_for_shows_in_the_servers_count() {
    let env = TestEnv::shared().await;
    let client = env.client().await.expect("an admin client");
    let before = collections(&client).await.expect("the count before");
    collect(&client).await.expect("a collection");
    let after = collections(&client).await.expect("the count after");
    assert!(
        after > before,
        "kube-apiserver counted {before} collections before and {after} after one was asked for"
    );
}
