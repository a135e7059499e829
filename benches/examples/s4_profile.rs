use lamina_benches::rig::Rig;
use lamina_integration::FsKind;
use std::time::Instant;
fn main() {
    let strategy = std::env::args().nth(1).unwrap_or("shared-ro".into());
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(1000);
    let rig = Rig::new(FsKind::Ext4, 1024);
    let image = rig.warm(&lamina_benches::images::sample(&rig.scratch("image")));
    for round in 0..3 {
        let ids: Vec<String> = (0..n).map(|i| format!("s4-{round}-{i}")).collect();
        let t = Instant::now();
        for id in &ids {
            rig.create(&image, id, &strategy, true);
        }
        let c = t.elapsed();
        let t = Instant::now();
        for id in &ids {
            rig.delete(id);
        }
        let d = t.elapsed();
        let t = Instant::now();
        rig.reap_all();
        let r = t.elapsed();
        eprintln!(
            "{strategy}: create {:?} delete {:?} reap {:?} per container; total {:?}",
            c / n as u32,
            d / n as u32,
            r / n as u32,
            (c + d + r) / n as u32
        );
    }
}
