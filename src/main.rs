fn main() {
    std::process::exit(layerfs::cli::run());
}
