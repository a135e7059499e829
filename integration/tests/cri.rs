//! containerd as a Kubernetes node with lamina as its CRI snapshotter, driven by crictl
//! as the kubelet drives it, each scenario run against containerd's own overlayfs in the
//! same test: lamina must pass what overlayfs passes. Every scenario runs on containerd
//! 2.4; a pod's lifecycle and restarts also on Debian's 1.6 (whose CRI has no user
//! namespaces, image volumes or capabilities).

#![allow(clippy::unwrap_used)]

use lamina_integration::containerd::Release;
use lamina_integration::cri::{self, Node, NodeSnapshotter, Pulls, container_config, pod_config};
use lamina_integration::require_root;
use lamina_integration::scratch::ScratchFs;
use lamina_integration::snapshotter::Daemon;

const IMAGE: &str = "lamina.test/busybox:1";

/// A lamina node's parts, dropped node first: pods, containerd, the daemon, the disk.
struct LaminaNode {
    node: Node,
    daemon: Daemon,
}

fn lamina_node(fs: &ScratchFs, capabilities: Vec<&'static str>) -> LaminaNode {
    lamina_node_on(Release::V2, fs, capabilities)
}

fn lamina_node_on(release: Release, fs: &ScratchFs, capabilities: Vec<&'static str>) -> LaminaNode {
    let store = fs.path().join("store");
    let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let pause = cri::pause_image(&fs.path().join("images"));
    let node = Node::start_release(
        release,
        &fs.path().join("containerd-lamina"),
        NodeSnapshotter::Lamina {
            socket: daemon.socket.clone(),
            store,
            capabilities,
        },
        &pause,
        Pulls::default(),
    );
    LaminaNode { node, daemon }
}

fn overlayfs_node(fs: &ScratchFs) -> Node {
    overlayfs_node_on(Release::V2, fs)
}

fn overlayfs_node_on(release: Release, fs: &ScratchFs) -> Node {
    let pause = cri::pause_image(&fs.path().join("images"));
    Node::start_release(
        release,
        &fs.path().join("containerd-overlayfs"),
        NodeSnapshotter::Overlayfs,
        &pause,
        Pulls::default(),
    )
}

/// A pod's lifecycle as the kubelet runs it; what each step showed.
fn pod_lifecycle(node: &Node, fs: &ScratchFs) -> Vec<String> {
    let name = node.snapshotter.name();
    let image = cri::image_archive(&fs.path().join("images"), IMAGE, &["/bin/sh"]);
    node.import(&image);
    let mut seen = Vec::new();
    let logs = fs.path().join(format!("logs-{name}"));
    let pod = pod_config(&format!("life-{name}"), &logs, None);
    let pod_id = node.run_pod(&pod);
    let container = container_config(
        "main",
        IMAGE,
        "echo started; echo written > /mine; cat /top.txt; sleep 300",
        &pod,
    );
    let id = node.start_container(&pod_id, &pod, &container);
    seen.push(node.exec(&id, "cat /mine; ls /"));
    lamina_integration::wait_until("the container's log", || {
        node.crictl(&["logs", &id]).stdout.contains("started")
    });
    seen.push(node.crictl_ok(&["logs", &id]));
    let images = node.crictl_ok(&["images", "-q"]);
    seen.push(format!("images listed: {}", images.lines().count()));
    let stats = node.crictl_ok(&["stats", "-o", "json", &id]);
    seen.push(format!(
        "stats has writable layer: {}",
        stats.contains("writableLayer")
    ));
    node.crictl_ok(&["stop", "-t", "1", &id]);
    node.crictl_ok(&["rm", &id]);
    node.remove_pod(&pod_id);
    node.crictl_ok(&["rmi", IMAGE]);
    seen
}

#[test]
fn a_pod_lives_and_goes_on_lamina_as_on_overlayfs_on_containerd_2_4() {
    pod_lives_and_goes(Release::V2);
}

#[test]
fn a_pod_lives_and_goes_on_lamina_as_on_overlayfs_on_containerd_1_6() {
    pod_lives_and_goes(Release::Debian);
}

fn pod_lives_and_goes(release: Release) {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let expected = {
        let node = overlayfs_node_on(release, &fs);
        pod_lifecycle(&node, &fs)
    };
    let lamina = lamina_node_on(release, &fs, vec![]);
    let seen = pod_lifecycle(&lamina.node, &fs);
    assert_eq!(seen, expected);
    assert!(seen[0].starts_with("written\n"), "{seen:?}");
    assert!(seen[1].contains("from the top layer"), "{seen:?}");
    // The kubelet sizes image GC and eviction from ImageFsInfo: lamina's store, and what
    // its snapshots hold (containerd sums each one's Usage).
    let store = fs.path().join("store");
    lamina_integration::wait_until("ImageFsInfo to count the store", || {
        let info: serde_json::Value =
            serde_json::from_str(&lamina.node.crictl_ok(&["imagefsinfo", "-o", "json"])).unwrap();
        let image_fs = &info["status"]["imageFilesystems"][0];
        // 1.6 does not read a proxy's `exports`: it names a directory of its own.
        if release == Release::V2 {
            assert_eq!(
                image_fs["fsId"]["mountpoint"],
                store.display().to_string(),
                "{info}"
            );
        }
        let used: u64 = image_fs["usedBytes"]["value"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let inodes: u64 = image_fs["inodesUsed"]["value"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        used > 1_000_000 && inodes > 10
    });
}

/// The upper directory of the overlay at container `id`'s rootfs, from this host's mount
/// table: where the container's writes land.
fn upper_of(node: &Node, id: &str) -> std::path::PathBuf {
    let rootfs = node
        .containerd
        .dir
        .join("state/io.containerd.runtime.v2.task/k8s.io")
        .join(id)
        .join("rootfs")
        .display()
        .to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(rootfs.as_str()))
        .unwrap_or_else(|| panic!("{rootfs} is not mounted"));
    let upper = line
        .split([' ', ','])
        .find_map(|o| o.strip_prefix("upperdir="))
        .unwrap_or_else(|| panic!("no upperdir in {line}"));
    std::path::PathBuf::from(upper)
}

/// Two pods in user namespaces of their own: what each container shows of the image's
/// owners inside, and who owns its writes on the host.
fn userns_pods(node: &Node, fs: &ScratchFs) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let name = node.snapshotter.name();
    let image = cri::image_archive(&fs.path().join("images"), IMAGE, &["/bin/sh"]);
    node.import(&image);
    let logs = fs.path().join(format!("logs-userns-{name}"));
    let mut seen = Vec::new();
    for (n, host) in [(1, 100_000u32), (2, 200_000)] {
        let pod = pod_config(&format!("userns{n}-{name}"), &logs, Some(host));
        let pod_id = node.run_pod(&pod);
        let script = "echo mine > /mine; mkdir -p /made; sleep 300";
        let id = node.start_container(
            &pod_id,
            &pod,
            &container_config("main", IMAGE, script, &pod),
        );
        lamina_integration::wait_until("the container's write", || {
            node.crictl(&["exec", &id, "test", "-e", "/made"]).code == 0
        });
        seen.push(node.exec(
            &id,
            "cat /proc/self/uid_map | tr -s ' '; stat -c '%n %u:%g' / /bin/sh /top.txt /mine /usr/local/bin/suid-tool; cat /top.txt",
        ));
        let upper = upper_of(node, &id);
        let mine = std::fs::metadata(upper.join("mine")).unwrap();
        seen.push(format!(
            "host owner of /mine: {}:{}",
            mine.uid(),
            mine.gid()
        ));
    }
    seen
}

#[test]
fn user_namespaced_pods_see_image_owners_and_write_as_their_mapped_ids() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let expected = {
        let node = overlayfs_node(&fs);
        userns_pods(&node, &fs)
    };
    assert!(expected[0].contains("/bin/sh 0:0\n"), "{expected:?}");
    assert_eq!(expected[1], "host owner of /mine: 100000:100000");
    assert_eq!(expected[3], "host owner of /mine: 200000:200000");
    {
        let lamina = lamina_node(&fs, vec!["remap-ids"]);
        assert_eq!(userns_pods(&lamina.node, &fs), expected);
        // Both pods run on the image's two layers as stored once, not a chowned copy each.
        assert_eq!(
            std::fs::read_dir(fs.path().join("store/layers"))
                .unwrap()
                .count(),
            2
        );
    }
    // Without `remap-ids` containerd chowns a copy of the image per mapping and still
    // passes the mapping labels; lamina must not map that copy a second time.
    let fs = ScratchFs::ext4(1024);
    let lamina = lamina_node(&fs, vec![]);
    assert_eq!(userns_pods(&lamina.node, &fs), expected);
}

/// A container mounting another image read-only at `/vol` (a CRI image volume): what it
/// reads there, whether it can write there, and the snapshots before and after its pod.
fn image_volume(node: &Node, fs: &ScratchFs) -> Vec<String> {
    let name = node.snapshotter.name();
    let images = fs.path().join("images");
    node.import(&cri::image_archive(&images, IMAGE, &["/bin/sh"]));
    let volume = "lamina.test/volume:1";
    node.import(&cri::volume_image(&images, volume));
    let mut seen = vec![format!("before: {:?}", node.snapshot_kinds())];
    let pod = pod_config(
        &format!("volume-{name}"),
        &fs.path().join(format!("logs-vol-{name}")),
        None,
    );
    let pod_id = node.run_pod(&pod);
    let mut container = container_config("main", IMAGE, "sleep 300", &pod);
    container["mounts"] = serde_json::json!([
        { "container_path": "/vol", "image": { "image": volume }, "readonly": true }
    ]);
    let id = node.start_container(&pod_id, &pod, &container);
    seen.push(node.exec(
        &id,
        "cat /vol/volume.txt; ls /vol; touch /vol/x 2>/dev/null || echo read-only",
    ));
    seen.push(format!("running: {:?}", node.snapshot_kinds()));
    node.remove_pod(&pod_id);
    seen.push(format!("after: {:?}", node.snapshot_kinds()));
    seen
}

#[test]
fn an_image_volume_is_mounted_read_only_and_released_with_its_pod() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let expected = {
        let node = overlayfs_node(&fs);
        image_volume(&node, &fs)
    };
    let lamina = lamina_node(&fs, vec![]);
    let seen = image_volume(&lamina.node, &fs);
    eprintln!("{seen:?}");
    assert_eq!(seen, expected);
}

/// Pulls the sample image (whiteouts and an opaque directory in its second layer) from
/// `registry` with layers unpacked in parallel, and runs the proof script in it.
fn parallel_pull(node: &Node, registry: &lamina_integration::registry::Registry) -> String {
    let name = node.snapshotter.name();
    node.trust_registry(&registry.host);
    let image = format!("{}/lamina/sample:latest", registry.host);
    node.crictl_ok(&["pull", &image]);
    let pod = pod_config(
        &format!("pull-{name}"),
        &node.containerd.dir.join("pod-logs"),
        None,
    );
    let pod_id = node.run_pod(&pod);
    let script = format!("{}; sleep 300", lamina_integration::proof::SCRIPT);
    let id = node.start_container(
        &pod_id,
        &pod,
        &container_config("main", &image, &script, &pod),
    );
    lamina_integration::wait_until("the proof's output", || {
        node.crictl(&["logs", &id]).stdout.contains("busybox")
    });
    let out = node.crictl_ok(&["logs", &id]);
    node.remove_pod(&pod_id);
    out
}

#[test]
fn parallel_unpack_rebases_layers_and_keeps_their_whiteouts() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let files = lamina_integration::sample_image(&fs.path().join("sample"));
    let registry = lamina_integration::registry::Registry::start(&fs.path().join("registry"), None);
    registry.push(
        &files.oci_layout,
        lamina_sample::SAMPLE_REF,
        "lamina/sample:latest",
    );
    let parallel = cri::Pulls {
        downloads: 3,
        unpacks: Some(4),
    };
    let pause = cri::pause_image(&fs.path().join("images"));
    let expected = {
        let node = Node::start_with(
            &fs.path().join("containerd-overlayfs"),
            NodeSnapshotter::Overlayfs,
            &pause,
            parallel,
        );
        parallel_pull(&node, &registry)
    };
    assert_eq!(format!("{expected}\n"), lamina_integration::proof::EXPECTED);
    let store = fs.path().join("store");
    let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let node = Node::start_with(
        &fs.path().join("containerd-lamina"),
        NodeSnapshotter::Lamina {
            socket: daemon.socket.clone(),
            store,
            capabilities: vec!["rebase"],
        },
        &pause,
        parallel,
    );
    assert_eq!(parallel_pull(&node, &registry), expected);
    assert!(
        daemon.log().contains("rebased onto its parent"),
        "no layer was unpacked in parallel: {}\n{}\n{}",
        daemon.log(),
        std::fs::read_to_string(node.containerd.dir.join("config.toml")).unwrap(),
        std::fs::read_to_string(node.containerd.dir.join("containerd.log")).unwrap()
    );
}

/// A pod through restarts, as a node lives them: containerd restarted with the pod
/// running, then the snapshotter (`restart_snapshotter`), then a second container in
/// the pod, the pod's removal and its image's; what each step showed.
fn through_restarts(
    node: &mut Node,
    fs: &ScratchFs,
    restart_snapshotter: impl FnOnce(),
) -> Vec<String> {
    let name = node.snapshotter.name();
    node.import(&cri::image_archive(
        &fs.path().join("images"),
        IMAGE,
        &["/bin/sh"],
    ));
    let mut seen = vec![format!("before: {:?}", node.snapshot_kinds())];
    let pod = pod_config(
        &format!("restarts-{name}"),
        &fs.path().join(format!("logs-restarts-{name}")),
        None,
    );
    let pod_id = node.run_pod(&pod);
    let first = node.start_container(
        &pod_id,
        &pod,
        &container_config("first", IMAGE, "echo before > /mine; sleep 300", &pod),
    );
    lamina_integration::wait_until("the first container's write", || {
        node.crictl(&["exec", &first, "test", "-e", "/mine"]).code == 0
    });
    node.containerd.restart();
    lamina_integration::wait_until("CRI after containerd's restart", || {
        node.crictl(&["exec", &first, "cat", "/mine"]).code == 0
    });
    seen.push(node.exec(&first, "cat /mine"));
    restart_snapshotter();
    // containerd redials the snapshotter within its gRPC backoff; the kubelet retries a
    // create that fails meanwhile, as this does.
    let second = container_config("second", IMAGE, "cat /top.txt; sleep 300", &pod);
    let pod_file = node.containerd.dir.join("pod-restarts.json");
    std::fs::write(&pod_file, pod.to_string()).unwrap();
    let file = node.containerd.dir.join("container-second.json");
    std::fs::write(&file, second.to_string()).unwrap();
    let mut second_id = String::new();
    lamina_integration::wait_until(
        "a container created after the snapshotter's restart",
        || {
            let out = node.crictl(&[
                "create",
                &pod_id,
                file.to_str().unwrap(),
                pod_file.to_str().unwrap(),
            ]);
            second_id = out.stdout.trim().to_string();
            out.code == 0
        },
    );
    node.crictl_ok(&["start", &second_id]);
    seen.push(node.exec(&second_id, "cat /top.txt; test -e /mine || echo not-first"));
    seen.push(node.exec(&first, "cat /mine"));
    seen.push(format!("running: {:?}", node.snapshot_kinds()));
    node.remove_pod(&pod_id);
    node.crictl_ok(&["rmi", IMAGE]);
    lamina_integration::wait_until("the image's snapshots to go", || {
        node.snapshot_kinds().len() == 1
    });
    seen.push(format!("after: {:?}", node.snapshot_kinds()));
    seen
}

#[test]
fn pods_live_through_restarts_of_containerd_and_of_the_snapshotter_on_containerd_2_4() {
    pods_through_restarts(Release::V2);
}

#[test]
fn pods_live_through_restarts_of_containerd_and_of_the_snapshotter_on_containerd_1_6() {
    pods_through_restarts(Release::Debian);
}

fn pods_through_restarts(release: Release) {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let expected = {
        let mut node = overlayfs_node_on(release, &fs);
        through_restarts(&mut node, &fs, || {})
    };
    assert_eq!(expected[1], "before");
    let mut lamina = lamina_node_on(release, &fs, vec![]);
    let daemon = &mut lamina.daemon;
    let seen = through_restarts(&mut lamina.node, &fs, || daemon.crash_and_restart());
    assert_eq!(seen, expected);
}
