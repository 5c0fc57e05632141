//! A desktop application embedding kvslice: open a model on the GPU, stream a greedy answer.
use kvslice_runtime::{DeviceChoice, GenerateOptions, LoadedModel, Sampler, Session, init_device};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, prompt) = (args.get(1).expect("usage: embed MODEL PROMPT"), args.get(2).map_or("Hello", |s| s));
    let (device, _) = pollster::block_on(init_device(DeviceChoice::Wgpu))?;
    let loaded = LoadedModel::open(std::path::Path::new(path), &device)?;
    let ids = loaded.encode_prompt(prompt, true)?;
    let mut session = Session::new(&loaded.model, ids.len() + 32)?;
    let options = GenerateOptions { max_new_tokens: 32, sampler: Sampler::greedy(), stop_tokens: loaded.stop_tokens() };
    let (tokens, stats) = pollster::block_on(session.generate(&ids, &options, |_| true))?;
    println!("{}\n{stats}", loaded.decode(&tokens)?);
    Ok(())
}
