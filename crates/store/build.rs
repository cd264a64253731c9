// `sqlx::migrate!` embeds the migrations; a migration added later must rebuild this crate.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
