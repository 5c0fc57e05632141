//! A desktop application embedding kvslice: open a model on the GPU, stream a greedy answer.
use std::io::Write;

use kvslice_runtime::{DeviceChoice, GenerateOptions, Generator, LoadedModel, init_device};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, prompt) = (args.get(1).expect("usage: embed MODEL PROMPT"), args.get(2).map_or("Hello", |s| s));
    let (device, _) = pollster::block_on(init_device(DeviceChoice::Wgpu))?;
    let loaded = LoadedModel::open(std::path::Path::new(path), &device)?;
    let ids = loaded.encode_prompt(prompt, true)?;
    let options = GenerateOptions::greedy(32, loaded.stop_tokens());
    let mut generator =
        pollster::block_on(Generator::prefill(&loaded.model, &ids, options, None))?.with_tokenizer(&loaded.tokenizer);
    let mut out = std::io::stdout();
    while let Some(token) = pollster::block_on(generator.next())? {
        out.write_all(token.text.as_bytes())?;
        out.flush()?;
    }
    println!("{}\n{}", generator.rest()?, generator.stats());
    Ok(())
}
