#include "step04_speculative/variants.hpp"

#include "llm/errors.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/ngram_drafter.hpp"

namespace step04 {
namespace {

std::unique_ptr<Drafter> no_drafter(const DrafterSetup&) { return nullptr; }

std::unique_ptr<Drafter> draft_model(const DrafterSetup& s) {
  if (s.draft == nullptr) throw llm::InputError("the draft_model variant needs --draft-model FILE");
  // Check before building the model: a mismatched file should fail fast.
  check_same_vocabulary(s.draft->config, s.target->config, s.draft_name);
  return std::make_unique<ModelDrafter>("draft_model(" + s.draft_name + ")", s.make_model(*s.draft),
                                        s.target->config);
}

std::unique_ptr<Drafter> early_exit(const DrafterSetup& s) {
  return make_early_exit_drafter(*s.target, s.draft_layers, s.make_model);
}

std::unique_ptr<Drafter> ngram(const DrafterSetup& s) {
  return std::make_unique<NgramDrafter>(s.ngram, s.target->config.vocab_size);
}

}  // namespace

const std::vector<llm::Variant<MakeDrafterFn>>& variants() {
  static const std::vector<llm::Variant<MakeDrafterFn>> table = {
      {variant_id::kPlain, "plain", "no drafter: one target pass per token (step 01's generate_cached)",
       llm::Backend::Any, &no_drafter},
      {variant_id::kDraftModel, "draft_model",
       "a second checkpoint with the same vocabulary drafts k tokens; one target pass verifies them",
       llm::Backend::Any, &draft_model},
      {variant_id::kEarlyExit, "early_exit",
       "self-draft: the target's first L layers + final norm + classifier draft k tokens", llm::Backend::Any,
       &early_exit},
      {variant_id::kNgram, "ngram",
       "prompt lookup: copy what followed the last n tokens earlier in the text (no model)", llm::Backend::Any,
       &ngram},
  };
  return table;
}

}  // namespace step04
